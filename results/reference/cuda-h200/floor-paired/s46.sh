#!/usr/bin/env bash
# Planned for an H200 in s46; s47 ran it as `s46.sh folded,written 440 100` and got an H100
# (cuda-h100/floor-paired/call4). gpt2-xl on `folded` (fused.fold_norms: GPT-2's layer norms and
# residual adds inside the matvec kernels, two kernels fewer per layer) and `fused`, side by side
# in one process, against the floor, each one's greedy tokens against eager's; then tests/test_matvec.py
# on the GPU (the kernels, a compiled engine's greedy tokens folded and not). Usage, from the
# repository's root after results/reference/cuda-h100/floor-matvec/prepare.sh, with carry
# [".whl", ".gpu"]: bash results/reference/cuda-h200/floor-paired/s46.sh [ENGINES [FLOOR_S
# [TESTS_S]]] (about 540 s as it stands).
set -uo pipefail
source results/reference/cuda-h200/floor-paired/setup.sh
floor ${1:-folded,fused} floor ${2:-440}
timeout ${3:-80} python3 -m pytest tests/test_matvec.py --noconftest -p no:cacheprovider -q -rs -p no:logging --durations=3 > $OUT/test_matvec.txt 2>&1; echo "exit $?" >> $OUT/test_matvec.txt
tail -4 $OUT/test_matvec.txt
