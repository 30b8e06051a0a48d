#!/usr/bin/env bash
# Sourced by this folder's device scripts, on the device, from the repository's root: installs the
# carried wheels (.whl/) into /tmp/site, sets the environment, and writes the commit (.gpu/commit)
# and the card's versions to $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 TQDM_DISABLE=1
cp .gpu/commit $OUT/commit.txt
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name())" | tee $OUT/versions.txt
nvidia-smi --query-gpu=name,serial,clocks.max.memory,clocks.max.sm,memory.total --format=csv >> $OUT/versions.txt 2>&1
floor() {  # engines, folder under $OUT, seconds: scripts/gpu_pair.py's bandwidth part
  mkdir -p $OUT/$2
  timeout $3 python3 scripts/gpu_pair.py --deadline $(($3 - 5)) --out $OUT/$2 --parts bandwidth \
    --floor-engines $1 2>&1 | grep -v USDT | tee $OUT/$2/run.log | grep "ms/token\|warm-up\|Error\|error" | cut -c1-300
}
