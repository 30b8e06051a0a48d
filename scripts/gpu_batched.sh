#!/usr/bin/env bash
# #17 on one CUDA host without Snakemake: tokens/s over the batch of batched autoregressive
# decoding, synchronized speculation (a draft model; and self-speculation, every row the same K)
# and the non-synchronized batch driven by the scheduler, at B = 1..64 and two context lengths
# (`decodelab batched`), with the forward timings its cost model is fitted to. Init weights:
# the costs are real, the acceptance is not (random models). Raw parquet + log in $OUT.
#   Usage: [BATCHES=.. CONTEXTS=.. BUDGET=..] scripts/gpu_batched.sh [SECONDS (default 500)] [--smoke]
# --smoke checks the logic on a CPU host: tiny models, B = 1 2, short contexts.
set -uo pipefail
deadline=$((SECONDS + ${1:-500}))
smoke=${2:-}
out=${OUT:-/tmp/gpu_batched_out}
python=${PYTHON:-python3}
models=${MODELS:-/tmp/gpu_batched_models}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TQDM_DISABLE=1
mkdir -p "$out" "$models"
if [ -n "$smoke" ]; then
  backend=cpu target=gpt2-tiny draft=gpt2-tiny batches="1 2" contexts="32 64" budget=8
else
  backend=cuda target=gpt2-medium draft=gpt2 batches=${BATCHES:-1 2 4 8 16 32 64}
  contexts=${CONTEXTS:-256 896} budget=${BUDGET:-64}
fi
{ date -u; git rev-parse HEAD 2>/dev/null; nvidia-smi 2>&1 | head -15; } >"$out/env.txt" 2>&1
for m in "$target" "$draft"; do
  [ -e "$models/$m/config.json" ] || $python -c "from decodelab import sources
sources.prepare({'source': 'init', 'preset': '$m', 'seed': 1}, '$models/$m')"
done
timeout -s INT "$((deadline - SECONDS - 10))" $python -m decodelab.cli batched \
  --target-dir "$models/$target" --draft-dir "$models/$draft" --backend "$backend" \
  --spec "{\"batches\": [${batches// /, }], \"contexts\": [${contexts// /, }], \"budget\": $budget,
    \"k\": 4, \"policy\": \"sink_window\", \"kv_budget\": 64, \"rounds\": 1, \"seed\": 0,
    \"dtype\": \"float32\", \"device\": \"$backend\"}" \
  --repeat 0 --machine '{"preflight": "off"}' \
  --costs "$out/costs.parquet" --out "$out/throughput.parquet" 2>&1 | tee "$out/run.log"
echo "exit status ${PIPESTATUS[0]}; left: $((deadline - SECONDS)) s" | tee -a "$out/run.log"
