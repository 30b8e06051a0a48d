"""Decode-latency sweeps, the KV-cache ablation and the regime analyses."""
