"""Batched speculation without a shared schedule (ASPIRE's setting)."""
