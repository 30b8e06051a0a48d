#!/usr/bin/env bash
# s39 (carry [".whl", ".gpu"]; write HEAD to .gpu/commit first).
# Call A: the kernel's tests, then gpt2-xl/gpt2 on fused, compiled+attend (cuBLAS GEMVs with the
# kernel) and linear+attend (the same on the Linear layout), then test_graphs -k fused.
exec env ENGINES=${ENGINES:-fused,compiled+attend,linear+attend} GRAPHS_K=${GRAPHS_K:-fused} \
  TESTS_AFTER=${TESTS_AFTER:-90} bash "$(dirname "$0")/attend.sh" "${1:-585}"
