#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
export PYTHONUNBUFFERED=1 PATH=/tmp/bin:$PATH DECODELAB_GIT_COMMIT=$(cat .gpu/commit 2>/dev/null || echo unknown)
mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m decodelab.cli "$@"\n' >/tmp/bin/decodelab
chmod +x /tmp/bin/decodelab
python3 -c "import torch; print(torch.backends.cudnn.version())"
PYTHONPATH=/tmp/site:$PWD/src python3 -m snakemake results/models/{gpt2,opt-125m} --configfile config/gpu.yaml --cores 4 2>&1 | tail -n 1
PYTHONPATH=$PWD/results/reference/cuda-h200/diagnostics/scripts/nocudnn:/tmp/site:$PWD/src timeout 200 python3 -m snakemake \
  results/nocudnn/cuda/sweep/{gpt2,opt-125m}/rep0.parquet --configfile config/gpu.yaml --config host=nocudnn \
  --cores "$(nproc)" --resources gpu=2 bench_cpu=1 mps=1 2>&1 | grep -E "Finished|rror" | tail -n 4
tar czf "$OUT/nocudnn.tgz" results/nocudnn
ls -la "$OUT"
