"""The layout of the sparse KV views (`decodelab.engines.sparse_kv`), without torch: the config
checks read it before any job runs."""

CHUNK = 8
SINK = 4
WINDOW = 8  # recent tokens the chunked policies always keep, beyond the last partial chunk


def min_budget(name: str) -> int:
    # The chunked layout needs room for the window, the last partial chunk and chunk 0.
    return SINK + 1 if name == "sink_window" else WINDOW + (CHUNK - 1) + CHUNK
