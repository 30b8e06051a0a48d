#!/usr/bin/env bash
# s43's third call: test_graphs' compiled speculative tests on `fused`, which failed in call 2.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 TQDM_DISABLE=1
cp .gpu/commit $OUT/commit.txt
nvidia-smi --query-gpu=name,serial --format=csv > $OUT/versions.txt 2>&1
timeout ${1:-140} python3 -m pytest tests/test_graphs.py --noconftest -p no:cacheprovider -q -rs -k "fused" --durations=5 > $OUT/tests.txt 2>&1; echo "exit $?" >> $OUT/tests.txt
tail -4 $OUT/tests.txt
