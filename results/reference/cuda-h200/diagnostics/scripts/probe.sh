#!/usr/bin/env bash
# Is the NVML clock probe behind the step-ups? The same sweep jobs (rep 0, same shuffle) without
# the probe, and with a probe that initialises NVML once instead of on every read.
set -uo pipefail
deadline=$((SECONDS + ${1:-300}))
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
export PYTHONUNBUFFERED=1 DECODELAB_GIT_COMMIT=$(cat .gpu/commit 2>/dev/null || echo unknown) PATH=/tmp/bin:$PATH
mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m decodelab.cli "$@"\n' >/tmp/bin/decodelab
chmod +x /tmp/bin/decodelab
gpus=$(nvidia-smi -L | wc -l)
run() {  # host sitecustomize-dir targets...
  local host=$1 site=$2; shift 2
  PYTHONPATH=$site:/tmp/site:$PWD/src timeout -s INT $((deadline - SECONDS)) \
    python3 -m snakemake "$@" --configfile config/gpu.yaml --config host=$host --cores "$(nproc)" \
    --resources gpu="$gpus" bench_cpu=1 mps=1 --rerun-incomplete --keep-going 2>&1 | grep -E "Finished|rror" | tail -n 6
}
PYTHONPATH=/tmp/site:$PWD/src python3 -m snakemake results/models/{gpt2,opt-125m} --configfile config/gpu.yaml --cores 4 2>&1 | tail -n 1
for variant in ${VARIANTS:-noprobe onceprobe}; do
  run $variant $PWD/results/reference/cuda-h200/diagnostics/scripts/$variant results/$variant/cuda/sweep/{gpt2,opt-125m}/rep0.parquet
done
tar czf "$OUT/probe.tgz" $(for v in ${VARIANTS:-noprobe onceprobe}; do echo results/$v; done) 2>/dev/null
ls -la "$OUT"; echo "left: $((deadline - SECONDS)) s"
