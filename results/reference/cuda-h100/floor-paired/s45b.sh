#!/usr/bin/env bash
# s45's second call (an H200, 441 s of device time left): gpt2-xl on `fused` with GPT-2's layer
# norms and residual adds folded into the matvec kernels (fused.fold_norms) against the floor, its
# greedy tokens against eager's; then tests/test_matvec.py (the kernels, and a compiled engine's
# greedy tokens) on the GPU.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 TQDM_DISABLE=1
cp .gpu/commit $OUT/commit.txt
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name())" | tee $OUT/versions.txt
nvidia-smi --query-gpu=name,serial,clocks.max.memory,clocks.max.sm,memory.total --format=csv >> $OUT/versions.txt 2>&1
mkdir -p $OUT/fused
timeout 222 python3 scripts/gpu_pair.py --deadline 217 --out $OUT/fused --parts bandwidth \
  --floor-engines fused 2>&1 | grep -v USDT | tee $OUT/fused/run.log | grep "ms/token\|warm-up\|Error\|error" | cut -c1-300
timeout 50 python3 -m pytest tests/test_matvec.py --noconftest -p no:cacheprovider -q -rs -p no:logging --durations=3 > $OUT/test_matvec.txt 2>&1; echo "exit $?" >> $OUT/test_matvec.txt
tail -4 $OUT/test_matvec.txt
