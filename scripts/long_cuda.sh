#!/usr/bin/env bash
# The long-context study for the H200 reference, without Snakemake (scripts/long_cuda.py): train
# config/long.yaml's long-context target and its four sparse drafters (budget-robust, fixed budget,
# full cache only, no prefix), then the long-context study at 4K and 8K tokens, and 16K if time is
# left, and its tables. One tarball in $OUT holds results/gpu-runs/cuda-h200/long/. Trained models
# stay in $MODELS: a second call on the same warm machine skips straight to the study (give it the
# whole deadline).
#   Usage: scripts/long_cuda.sh [SECONDS (default 550)] [--smoke]
# STUDY_ARGS="--documents 2 --ks 4" shrinks the study for a short device budget.
# --smoke checks the logic in about a minute (on the GPU where there is one): tiny models, L = 256.
# The config checks need jsonschema: carried in `.whl` where the host lacks it (as gpu_pair.sh).
# A run lands in results/gpu-runs/ (raw rows, logs); what becomes a reference is its stats/ and a
# one-page README, copied into results/reference/<name>/ (results/reference/README.md).
set -uo pipefail
deadline=$((SECONDS + ${1:-550}))
smoke=${2:-}
out=${OUT:-/tmp/long_cuda_out}
python=${PYTHON:-python3}
ref=${REF:-results/gpu-runs/cuda-h200/long}
models=${MODELS:-/tmp/long_cuda_models}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TQDM_DISABLE=1
if ! $python -c "import jsonschema" 2>/dev/null && ls .whl/jsonschema-*.whl >/dev/null 2>&1; then
  $python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-schema \
    .whl/*.whl
  export PYTHONPATH=/tmp/site-schema:$PYTHONPATH
fi
left() { echo $((deadline - SECONDS - $1)); }

mkdir -p "$ref/logs" "$out"
{ date -u; git rev-parse HEAD 2>/dev/null; nvidia-smi 2>&1 | head -15
  $python -c "import torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__, 'cuda', torch.cuda.is_available())"; } >"$ref/logs/env.txt" 2>&1
cat "$ref/logs/env.txt"

# Leaves 20 s for the tarball; a call that finds its models trained appends to the log.
timeout -s INT "$(left 10)" $python scripts/long_cuda.py --deadline "$(left 20)" --out "$ref" \
  --models "$models" --lengths 4096 8192 16384 ${STUDY_ARGS:-} $smoke 2>&1 | tee -a "$ref/logs/run.log" "$out/run.log"

tar czf "$out/long.tgz" "$ref" && ls -la "$out"
echo "left: $((deadline - SECONDS)) s"
