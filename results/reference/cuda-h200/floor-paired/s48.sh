#!/usr/bin/env bash
# The next call (an H200): gpt2-xl on `fused` (since s48 each one-token attention writes its own
# cache slot) and `unwritten` (the cache-write kernel beside the attention kernel, `fused` until
# s48), one after the other in one process, against #18's floor; then the writing kernel's tests
# and the compiled engines' greedy tokens (tests/test_matvec.py) on the GPU. Usage, from the
# repository's root after results/reference/cuda-h100/floor-matvec/prepare.sh and
# `git rev-parse HEAD > .gpu/commit`, with carry [".whl", ".gpu"]:
# bash results/reference/cuda-h200/floor-paired/s48.sh [ENGINES [FLOOR_S [TESTS_S]]] (about 530 s).
set -uo pipefail
source results/reference/cuda-h200/floor-paired/setup.sh
floor ${1:-fused,unwritten} floor ${2:-430}
timeout ${3:-90} python3 -m pytest tests/test_attention.py tests/test_matvec.py -k "writ or compiled_engine" --noconftest -p no:cacheprovider -q -rs -p no:logging --durations=5 > $OUT/tests.txt 2>&1; echo "exit $?" >> $OUT/tests.txt
tail -4 $OUT/tests.txt
