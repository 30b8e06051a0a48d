"""Equivalence of speculative and autoregressive sampling at three levels."""
