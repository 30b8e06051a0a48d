#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 TQDM_DISABLE=1
mkdir -p $OUT/v
timeout $1 python3 results/reference/cuda-h100/floor-kernels/call2/floor2.py $OUT/v ${VARIANTS:-compiled,compiled_math,inner_math,linear_math} ${PRESETS:-gpt2-xl,gpt2} $(($1 - 20)) 2>&1 | grep -v -E "USDT|UserWarning|_warn_once" | tee $OUT/v/run.log | tail -30
python3 -c "
import pandas as pd
t = pd.read_csv('$OUT/v/top_kernels.csv')
for (m, v), g in t.groupby(['model', 'variant'], sort=False):
    print(m, v); print(g[['kernel', 'calls', 's', 'kind']].head(8).to_string(index=False, max_colwidth=90))
"
