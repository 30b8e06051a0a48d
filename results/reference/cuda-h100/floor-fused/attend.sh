#!/usr/bin/env bash
# s38: decodelab's Triton attention kernel on the GPU: its tests (s40: ATTN_GRAPH=1, then
# .gpu/attn_graph.py), then the floor engines with it (ENGINES), then tests/test_graphs.py in what
# is left. Usage: .gpu/attend.sh SECONDS
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 TQDM_DISABLE=1
END=$((SECONDS + ${1:-590}))
mkdir -p $OUT/floor
cp .gpu/commit $OUT/floor/commit.txt 2>/dev/null; git diff --stat > $OUT/floor/diff.txt 2>/dev/null
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name())" | tee $OUT/versions.txt
timeout 120 python3 -m pytest tests/test_attention.py --noconftest -p no:cacheprovider -q -rs \
  --durations=5 > $OUT/test_attention.txt 2>&1; echo "exit $?" >> $OUT/test_attention.txt
tail -8 $OUT/test_attention.txt
[ -n "${ATTN_GRAPH:-}" ] && timeout 150 python3 .gpu/attn_graph.py > $OUT/attn_graph.csv 2>&1; cat $OUT/attn_graph.csv 2>/dev/null | tail -120
[ -n "${LONGATTN:-}" ] && timeout 60 python3 .gpu/longattn.py > $OUT/longattn.csv 2>&1; cat $OUT/longattn.csv | tail -14
LEFT=$((END - SECONDS - ${TESTS_AFTER:-150}))
timeout $LEFT python3 scripts/gpu_pair.py --deadline $((LEFT - 10)) --out $OUT/floor --parts bandwidth \
  --floor-engines ${ENGINES:-graph+attend,compiled+attend,compiled} 2>&1 | grep -v USDT | tee $OUT/floor/run.log | tail -30
cut -d, -f1-30 $OUT/floor/stats/bandwidth.csv 2>/dev/null | head -3
LEFT=$((END - SECONDS - 5))
[ -z "${NO_GRAPHS:-}" ] && [ $LEFT -gt 30 ] && timeout $LEFT python3 -m pytest tests/test_graphs.py --noconftest -p no:cacheprovider -q -rs \
  -k "${GRAPHS_K:-not autotuned}" --durations=10 > $OUT/test_graphs.txt 2>&1; echo "exit $?" >> $OUT/test_graphs.txt
[ -f $OUT/test_graphs.txt ] && tail -12 $OUT/test_graphs.txt
