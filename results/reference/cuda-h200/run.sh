#!/usr/bin/env bash
# The H200 reference run: the Snakemake DAG of config/gpu.yaml up to the per-host statistics and
# figures (no TeX there), resumable across calls on the same machine. Usage: reference.sh SECONDS
set -uo pipefail
deadline=$((SECONDS + ${1:-560}))
[ -d /tmp/site/snakemake ] || python3 -m pip install -q --no-index --no-deps --no-compile \
  --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m decodelab.cli "$@"\n' >/tmp/bin/decodelab
chmod +x /tmp/bin/decodelab
export PYTHONPATH=/tmp/site:$PWD/src PATH=/tmp/bin:$PATH PYTHONUNBUFFERED=1
export DECODELAB_GIT_COMMIT=${DECODELAB_GIT_COMMIT:-unknown}
sm() { timeout -s INT $((deadline - SECONDS)) python3 -m snakemake --configfile config/gpu.yaml \
  --config host=cuda-h200 --cores 16 --rerun-incomplete --keep-going "$@"; }
{ nvidia-smi; python3 -m pip list 2>/dev/null; } >logs-gpu-env.txt 2>&1
models=$(python3 -c "import yaml; print(' '.join('results/models/'+m for m in yaml.safe_load(open('config/gpu.yaml'))['models']))")
sm $models 2>&1 | grep -v "^\s*$" | tail -n 40        # models first: nothing is timed beside them
sm results/cuda-h200/runs.parquet 2>&1 | tail -n 40    # then the sweeps alone on the GPU
sm --omit-from paper 2>&1 | tail -n 60                 # then speculative, verification, stats
mkdir -p logs; mv logs-gpu-env.txt logs/gpu-env.txt
tar czf "$OUT/h200.tgz" results/cuda-h200 logs benchmarks results/models/*/decodelab.json \
  results/models/*/config.json 2>/dev/null
ls -la "$OUT"; echo "left: $((deadline - SECONDS)) s"
