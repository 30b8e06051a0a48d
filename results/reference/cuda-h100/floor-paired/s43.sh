#!/usr/bin/env bash
# s43 call: gpt2-xl (then gpt2) on the floor engines ENGINES first, then the kernel and cache
# tests, then test_graphs' fused tests in what is left. Usage: bash .gpu/s43.sh SECONDS.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 TQDM_DISABLE=1
END=$((SECONDS + ${1:-400}))
cp .gpu/commit $OUT/commit.txt; git diff --stat > $OUT/diff.txt 2>/dev/null
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name())" | tee $OUT/versions.txt
nvidia-smi --query-gpu=name,serial,clocks.max.memory,clocks.max.sm --format=csv >> $OUT/versions.txt 2>&1
mkdir -p $OUT/floor
FS=${FLOOR_S:-230}
timeout $FS python3 scripts/gpu_pair.py --deadline $((FS - 5)) --out $OUT/floor --parts bandwidth \
  --floor-engines ${ENGINES:-fused} 2>&1 | grep -v USDT | tee $OUT/floor/run.log | grep "ms/token\|kernels per\|warm-up\|Error\|error\|floor" | cut -c1-400
cat $OUT/floor/stats/bandwidth.csv 2>/dev/null | cut -c1-300
LEFT=$((END - SECONDS - 3))
timeout $LEFT python3 -m pytest tests/test_attention.py tests/test_static_cache.py tests/test_matvec.py --noconftest -p no:cacheprovider -q -rs > $OUT/tests.txt 2>&1; echo "exit $?" >> $OUT/tests.txt
tail -4 $OUT/tests.txt
LEFT=$((END - SECONDS - 3))
[ $LEFT -gt 30 ] && { timeout $LEFT python3 -m pytest tests/test_graphs.py --noconftest -p no:cacheprovider -q -rs -k "fused and not refused" > $OUT/test_graphs.txt 2>&1; echo "exit $?" >> $OUT/test_graphs.txt; tail -4 $OUT/test_graphs.txt; }
