#!/usr/bin/env bash
# The next call (an H200): gpt2-xl on `folded` (fused.fold_norms: GPT-2's layer norms and residual
# adds inside the matvec kernels, two kernels fewer per layer) and `fused`, side by side in one
# process, against the floor, each one's greedy tokens against eager's; then tests/test_matvec.py
# on the GPU (the kernels, a compiled engine's greedy tokens folded and not). Usage, from the
# repository's root after results/reference/cuda-h100/floor-matvec/prepare.sh, with carry
# [".whl", ".gpu"]: bash .gpu/s46.sh [ENGINES [FLOOR_S [TESTS_S]]] (about 540 s as it stands).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 TQDM_DISABLE=1
cp .gpu/commit $OUT/commit.txt
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name())" | tee $OUT/versions.txt
nvidia-smi --query-gpu=name,serial,clocks.max.memory,clocks.max.sm,memory.total --format=csv >> $OUT/versions.txt 2>&1
mkdir -p $OUT/floor
timeout ${2:-440} python3 scripts/gpu_pair.py --deadline $((${2:-440} - 5)) --out $OUT/floor --parts bandwidth \
  --floor-engines ${1:-folded,fused} 2>&1 | grep -v USDT | tee $OUT/floor/run.log | grep "ms/token\|warm-up\|Error\|error" | cut -c1-300
timeout ${3:-80} python3 -m pytest tests/test_matvec.py --noconftest -p no:cacheprovider -q -rs -p no:logging --durations=3 > $OUT/test_matvec.txt 2>&1; echo "exit $?" >> $OUT/test_matvec.txt
tail -4 $OUT/test_matvec.txt
