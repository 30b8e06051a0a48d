#!/usr/bin/env bash
# s45's third call (320 s of device time left): gpt2-xl on `fused` with GPT-2's layer norms and
# residual adds folded into the matvec kernels (fused.fold_norms) against the floor, its greedy
# tokens against eager's, and nothing else; `fused` allowed 150 s (fewer reductions to tune).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 TQDM_DISABLE=1
cp .gpu/commit $OUT/commit.txt
nvidia-smi --query-gpu=name,serial,clocks.max.memory,clocks.max.sm,memory.total --format=csv > $OUT/versions.txt 2>&1
mkdir -p $OUT/fused
timeout ${1:-200} python3 - <<PY 2>&1 | grep -v USDT | tee $OUT/fused/run.log | grep "ms/token\|warm-up\|Error\|error" | cut -c1-300
import importlib.util, sys
spec = importlib.util.spec_from_file_location("gpu_pair", "scripts/gpu_pair.py")
sys.modules["gpu_pair"] = gpu_pair = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_pair)
gpu_pair.FLOOR_NEEDS["gpt2-xl"]["fused"] = 150
gpu_pair.main(["--deadline", str(${1:-200} - 5), "--out", "$OUT/fused", "--parts", "bandwidth",
               "--floor-engines", "fused"])
PY
