#!/usr/bin/env bash
# Step-up diagnosis: the DAG's own sweep jobs for gpt2, opt-125m and bloom-560m (rep 0), two GPU
# jobs at a time as in the reference run, with the harness's launch breakdown.
set -uo pipefail
deadline=$((SECONDS + ${1:-300}))
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m decodelab.cli "$@"\n' >/tmp/bin/decodelab
chmod +x /tmp/bin/decodelab
export PYTHONPATH=/tmp/site:$PWD/src PATH=/tmp/bin:$PATH PYTHONUNBUFFERED=1
export DECODELAB_GIT_COMMIT=$(cat .gpu/commit 2>/dev/null || echo unknown)
gpus=$(nvidia-smi -L | wc -l)
sm() { timeout -s INT $((deadline - SECONDS)) python3 -m snakemake "$@" --configfile config/gpu.yaml \
  --config host=cuda-h200 --cores "$(nproc)" --resources gpu="$gpus" bench_cpu=1 mps=1 \
  --rerun-incomplete --keep-going; }
h=results/cuda-h200/cuda/sweep
sm results/models/{gpt2,opt-125m,bloom-560m} 2>&1 | tail -n 3
sm $h/{gpt2,opt-125m,bloom-560m}/rep0.parquet 2>&1 | grep -E "Finished|Error|error" | tail -n 10
tar czf "$OUT/steps.tgz" results/cuda-h200 logs benchmarks 2>/dev/null
ls -la "$OUT"; echo "left: $((deadline - SECONDS)) s"
