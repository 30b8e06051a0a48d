#!/usr/bin/env bash
# gpt2-xl and gpt2 fp16 on reductions, compiled and graph against the floor, kernels split.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 TQDM_DISABLE=1
mkdir -p $OUT/floor
git rev-parse HEAD > $OUT/floor/commit.txt 2>/dev/null || cat .gpu/commit > $OUT/floor/commit.txt
timeout ${1:-540} python3 scripts/gpu_pair.py --deadline $((${1:-540} - 15)) --out $OUT/floor --parts bandwidth \
  --floor-engines ${ENGINES:-reductions,compiled,graph} 2>&1 | grep -v USDT | tee $OUT/floor/run.log | tail -40
cat $OUT/floor/stats/bandwidth.csv 2>/dev/null | cut -c1-400 | head -30
