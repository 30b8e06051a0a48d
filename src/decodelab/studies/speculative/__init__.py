"""Speculative decoding: acceptance, speedup and its theory per pair and K."""
