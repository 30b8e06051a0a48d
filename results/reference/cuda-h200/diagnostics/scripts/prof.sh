#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
export PYTHONUNBUFFERED=1 PATH=/tmp/bin:$PATH PROFILE_DIR=$PWD/results/profile/prof
mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m decodelab.cli "$@"\n' >/tmp/bin/decodelab
chmod +x /tmp/bin/decodelab
PYTHONPATH=/tmp/site:$PWD/src python3 -m snakemake results/models/gpt2 --configfile config/gpu.yaml --cores 4 2>&1 | tail -n 1
PYTHONPATH=$PWD/results/reference/cuda-h200/diagnostics/scripts/profile:/tmp/site:$PWD/src timeout 200 python3 -m snakemake \
  results/profile/cuda/sweep/gpt2/rep0.parquet --configfile config/gpu.yaml --config host=profile \
  --cores "$(nproc)" --resources gpu=1 bench_cpu=1 mps=1 2>&1 | grep -E "Finished|rror" | tail -n 4
ls results/profile/prof | head -30
tar czf "$OUT/prof.tgz" results/profile
ls -la "$OUT"
