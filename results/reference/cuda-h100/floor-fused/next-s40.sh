#!/usr/bin/env bash
# s40 (carry [".whl", ".gpu"]; write HEAD to .gpu/commit first): the kernel's tests, its variants
# timed inside a CUDA graph (attn_graph.py), gpt2-xl/gpt2 on fused and compiled side by side in
# one process, then test_graphs' fused tests that are not the refusals.
exec env ATTN_GRAPH=1 ENGINES=${ENGINES:-compiled,fused} GRAPHS_K=${GRAPHS_K:-"fused and not refused"} \
  TESTS_AFTER=${TESTS_AFTER:-70} bash "$(dirname "$0")/attend.sh" "${1:-585}"
