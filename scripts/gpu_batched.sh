#!/usr/bin/env bash
# The batched study on one CUDA host without Snakemake: tokens/s over the batch of autoregressive
# decoding, synchronized speculation (a draft model; and self-speculation, every row the same K)
# and the non-synchronized batch driven by the scheduler, without and with a refresh layer
# (REFRESH, the layer; null: none), at B = 1..64 and two context lengths (`decodelab batched`),
# with the forward timings its cost model is fitted to. Raw parquet + log in $OUT. Models: init
# weights by default (gpt2-medium / gpt2: the costs are real, the acceptance is not); TRAINED=1
# trains config.yaml's `target` and `draft` on the GPU first (real acceptance on held-out text;
# contexts 96 and 192, their 256 positions; REFRESH config.yaml's refresh layer).
#   Usage: [TRAINED=1] [BATCHES=.. CONTEXTS=.. BUDGET=.. ROUNDS=.. REFRESH=..]
#          scripts/gpu_batched.sh [SECONDS (default 500)] [--smoke]
# --smoke checks the logic on a CPU host: tiny models, B = 1 2, short contexts.
set -uo pipefail
deadline=$((SECONDS + ${1:-500}))
smoke=${2:-}
out=${OUT:-/tmp/gpu_batched_out}
python=${PYTHON:-python3}
models=${MODELS:-/tmp/gpu_batched_models}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TQDM_DISABLE=1
mkdir -p "$out" "$models"
kv_budget=64 k=4 refresh=${REFRESH:-null}
if [ -n "$smoke" ]; then
  backend=cpu target=gpt2-tiny draft=gpt2-tiny batches="1 2" contexts="32 64" budget=8
  refresh=${REFRESH:-0}
elif [ -n "${TRAINED:-}" ]; then
  backend=cuda target=target draft=draft batches=${BATCHES:-1 4 16 64}
  contexts=${CONTEXTS:-96 192} budget=${BUDGET:-32} kv_budget=32 k=3
  refresh=${REFRESH:-$($python -c "import json, yaml
print(json.dumps(yaml.safe_load(open('config.yaml'))['batched'].get('refresh_layer')))")}
else
  backend=cuda target=gpt2-medium draft=gpt2 batches=${BATCHES:-1 2 4 8 16 32 64}
  contexts=${CONTEXTS:-256 896} budget=${BUDGET:-64}
fi
{ date -u; git rev-parse HEAD 2>/dev/null; nvidia-smi 2>&1 | head -15; } >"$out/env.txt" 2>&1
if [ -n "${TRAINED:-}" ]; then
  $python -c "import yaml; from decodelab.backends import sources
specs = yaml.safe_load(open('config.yaml'))['models']
sources.prepare(specs['target'] | {'device': '$backend'}, '$models/target')
sources.prepare(specs['draft'] | {'device': '$backend'}, '$models/draft',
                teacher_dir='$models/target')" 2>&1 | tail -5 | tee "$out/train.log"
else
  for m in "$target" "$draft"; do
    [ -e "$models/$m/config.json" ] || $python -c "from decodelab.backends import sources
sources.prepare({'source': 'init', 'preset': '$m', 'seed': 1}, '$models/$m')"
  done
fi
timeout -s INT "$((deadline - SECONDS - 10))" $python -m decodelab.cli batched \
  --target-dir "$models/$target" --draft-dir "$models/$draft" --backend "$backend" \
  --spec "{\"batches\": [${batches// /, }], \"contexts\": [${contexts// /, }], \"budget\": $budget,
    \"k\": $k, \"policy\": \"sink_window\", \"kv_budget\": $kv_budget, \"rounds\": ${ROUNDS:-1},
    \"refresh_layer\": $refresh,
    \"seed\": 0, \"dtype\": \"float32\", \"device\": \"$backend\"}" \
  --repeat 0 --machine '{"preflight": "off"}' \
  --costs "$out/costs.parquet" --out "$out/throughput.parquet" 2>&1 | tee "$out/run.log"
echo "exit status ${PIPESTATUS[0]}; left: $((deadline - SECONDS)) s" | tee -a "$out/run.log"
