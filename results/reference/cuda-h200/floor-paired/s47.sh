#!/usr/bin/env bash
# The next call (an H200): gpt2-xl on `written` (fused.write_in_attention: each one-token
# attention reads c_attn's row whole and its kernel writes the cache slot, no cache-write or
# query-select kernel per layer) and `fused`, side by side in one process, against the floor;
# then the writing kernel's tests and the compiled engines' greedy tokens (tests/test_matvec.py)
# on the GPU. s47's second call ran it at a751d65 and got an H100 (cuda-h100/floor-paired/call5);
# s48 ran it as `s47.sh written,fused 320 1` at 149bd46, on an H100 too (call6 there). Engine names
# as they were before s48 (`written` is today's `fused`, `fused` today's `unwritten`): the next
# call is `s47.sh fused,unwritten`. Usage as s46.sh: bash results/reference/cuda-h200/floor-paired/s47.sh [ENGINES
# [FLOOR_S [TESTS_S]]] (about 530 s as it stands).
set -uo pipefail
source results/reference/cuda-h200/floor-paired/setup.sh
floor ${1:-fused,written} floor ${2:-430}
timeout ${3:-90} python3 -m pytest tests/test_attention.py tests/test_matvec.py -k "writ or compiled_engine" --noconftest -p no:cacheprovider -q -rs -p no:logging --durations=5 > $OUT/tests.txt 2>&1; echo "exit $?" >> $OUT/tests.txt
tail -4 $OUT/tests.txt
