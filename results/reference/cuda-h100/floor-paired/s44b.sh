#!/usr/bin/env bash
# s44's second call: the attention tests and the fused graph engine's speculative tests with a
# verification's rows in one program per head (attention.shares_rows) as the default.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 TQDM_DISABLE=1
cp .gpu/commit $OUT/commit.txt
nvidia-smi --query-gpu=name,serial --format=csv > $OUT/versions.txt 2>&1
timeout 70 python3 -m pytest tests/test_attention.py --noconftest -p no:cacheprovider -q -rs -p no:logging --durations=3 > $OUT/test_attention.txt 2>&1; echo "exit $?" >> $OUT/test_attention.txt
tail -6 $OUT/test_attention.txt
timeout ${GRAPHS_S:-120} python3 -m pytest tests/test_graphs.py --noconftest -p no:cacheprovider -q -rs -p no:logging -k "speculative and fused and not refused" --durations=3 > $OUT/test_graphs.txt 2>&1; echo "exit $?" >> $OUT/test_graphs.txt
tail -6 $OUT/test_graphs.txt
