#!/usr/bin/env bash
# An H200 call: gpt2-xl on today's `fused` (each one-token attention reads c_attn's row
# whole and its kernel writes the cache slot: fused.write_in_attention) and `unwritten` (the same
# without it), side by side in one process, against the floor; then the writing kernel's tests
# and the compiled engines' greedy tokens (tests/test_matvec.py) on the GPU. It ran on H100s only:
# at a751d65 (s47, cuda-h100/floor-paired/call5), as `s47.sh written,fused 320 1` at 149bd46 (s48,
# call6; before s48 `written` was today's `fused` and `fused` today's `unwritten`) and as it
# stands at 2a97832 (s49, call8; its 90 s of tests ran 15 of 17, so the default is now 150 s).
# On an H200 as it stands at 3b4b6ee (s52, call2 here: its 150 s of tests ran 16 of 17). Since
# 056ce67 the floor part times every engine before it profiles any.
# Usage: bash results/reference/cuda-h200/floor-paired/s47.sh [ENGINES [FLOOR_S [TESTS_S]]] (at
# most 560 s as it stands).
set -uo pipefail
source results/reference/cuda-h200/floor-paired/setup.sh
floor ${1:-fused,unwritten} floor ${2:-400}
timeout ${3:-150} python3 -m pytest tests/test_attention.py tests/test_matvec.py -k "writ or compiled_engine" --noconftest -p no:cacheprovider -q -rs -p no:logging --durations=5 > $OUT/tests.txt 2>&1; echo "exit $?" >> $OUT/tests.txt
tail -4 $OUT/tests.txt
