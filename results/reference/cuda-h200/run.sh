#!/usr/bin/env bash
# The H200 reference run: the Snakemake DAG of config/gpu.yaml up to the per-host statistics and
# figures (no TeX there), resumable across calls on the same machine, one GPU job per GPU
# (`--resources gpu=N`, decodelab takes a free device in each job).
# Usage: run.sh SECONDS [pair [JOB...]]. With `pair`, only the trained pair's jobs (speculative,
# eager and graph, parallelism, verification); JOBs (outputs under results/<host>/) pick
# which of them, in order.
set -uo pipefail
deadline=$((SECONDS + ${1:-560}))
[ -d /tmp/site/snakemake ] || python3 -m pip install -q --no-index --no-deps --no-compile \
  --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m decodelab.cli "$@"\n' >/tmp/bin/decodelab
chmod +x /tmp/bin/decodelab
export PYTHONPATH=/tmp/site:$PWD/src PATH=/tmp/bin:$PATH PYTHONUNBUFFERED=1
export DECODELAB_GIT_COMMIT=$(cat .gpu/commit 2>/dev/null || echo unknown)
gpus=$(nvidia-smi -L | wc -l)
# the host's name from its GPU's (cuda-h200, cuda-h100, ...): a run on another kind stays apart
host=cuda-$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 | grep -o -i 'h[0-9]00' |
  tr 'H' 'h')
[ "$host" = cuda- ] && host=cuda-gpu
echo "host: $host"
sm() { local left=$((deadline - SECONDS)); [ $left -gt 0 ] || { echo "no time left for $*"; return 1; }
  timeout -s INT $left python3 -m snakemake "$@" --configfile config/gpu.yaml \
  --config host=$host --cores "$(nproc)" --resources gpu="$gpus" bench_cpu=1 mps=1 \
  --rerun-incomplete --keep-going --rerun-triggers params input code; }
mkdir -p logs && { nvidia-smi; nvidia-smi -q -d CLOCK,PERFORMANCE; python3 -m pip list; } \
  >logs/gpu-env.txt 2>&1
models=$(python3 -c "import yaml; print(' '.join('results/models/'+m for m in yaml.safe_load(open('config/gpu.yaml'))['models']))")
[ "${2:-}" = pair ] && models="results/models/target results/models/draft"
h=results/$host
sm $models 2>&1 | grep -v "^\s*$" | tail -n 30        # models first: nothing is timed beside them
for m in $models; do python3 -c "import json, sys; d = json.load(open(sys.argv[1]))
print(sys.argv[1], 'held-out', d.get('heldout_loss'), 'train s', d.get('train_seconds'))" \
  $m/decodelab.json 2>/dev/null; done
# The trained pair's jobs next, all on this machine (a pair trained again would differ), the
# cheap timed ones first: level 3 alone takes minutes, and a call cut short keeps what finished.
jobs=("${@:3}")
[ ${#jobs[@]} -gt 0 ] || jobs=(speculative/{cuda-cuda-graph,cuda-cuda-pipelined,cuda-cuda}/rep{0,1}.parquet
  "cuda/parallelism/target/rep0.parquet cuda/parallelism/target/rep1.parquet"
  speculative/cpu-cuda/rep{0,1}.parquet verification/real_cuda-cuda-graph.json
  verification/real_cuda-cuda-pipelined.json verification/real_cuda-cuda.json)
for job in "${jobs[@]}"; do sm $(printf "$h/%s " $job) 2>&1 | tail -n 30; done
if [ "${2:-}" != pair ]; then
  sm $h/runs.parquet 2>&1 | tail -n 30                # the sweeps
  sm --omit-from paper 2>&1 | tail -n 40              # statistics and figures
fi
tar czf "$OUT/$host.tgz" "$h" logs benchmarks results/models/*/decodelab.json \
  results/models/*/config.json 2>/dev/null
ls -la "$OUT"; echo "left: $((deadline - SECONDS)) s"
