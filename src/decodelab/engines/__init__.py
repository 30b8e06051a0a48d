"""Decoding engines: the autoregressive loop, sampling, speculative decoding (eager, pipelined,
long-context, batched), sparse KV views."""
