"""decodelab: decode-latency regimes, KV-cache ablations and speculative decoding, reproducibly."""

__version__ = "0.1.0"
