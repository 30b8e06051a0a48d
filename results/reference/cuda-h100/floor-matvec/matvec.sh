#!/usr/bin/env bash
# s41 (carry [".whl", ".gpu"]; prepare.sh first): decodelab's matvec kernel on the GPU: its tests,
# gpt2-xl (then gpt2) on the floor engines ENGINES, then one-row matmuls timed inside a CUDA graph
# (matvec_graph.py) in what is left. Usage: bash .gpu/matvec.sh SECONDS. (The calls ran ENGINES=matvec,
# the names of then: `matvec` is now `fused`, their `fused` now `reductions+attend`.)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 TQDM_DISABLE=1
END=$((SECONDS + ${1:-585}))
mkdir -p $OUT/floor
cp .gpu/commit $OUT/commit.txt 2>/dev/null; git diff --stat > $OUT/diff.txt 2>/dev/null
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name())" | tee $OUT/versions.txt
nvidia-smi --query-gpu=name,serial,clocks.max.memory,clocks.max.sm --format=csv >> $OUT/versions.txt 2>&1
timeout 120 python3 -m pytest tests/test_matvec.py --noconftest -p no:cacheprovider -q -rs ${TESTS_K:+-k} ${TESTS_K:+"$TESTS_K"} \
  --durations=5 > $OUT/test_matvec.txt 2>&1; echo "exit $?" >> $OUT/test_matvec.txt
tail -6 $OUT/test_matvec.txt
LEFT=$((END - SECONDS - ${BENCH_AFTER:-150}))
timeout $LEFT python3 scripts/gpu_pair.py --deadline $((LEFT - 10)) --out $OUT/floor --parts bandwidth \
  --floor-engines ${ENGINES:-fused,reductions+attend} 2>&1 | grep -v USDT | tee $OUT/floor/run.log | tail -30
LEFT=$((END - SECONDS - 5))
[ $LEFT -gt 20 ] && timeout $LEFT python3 .gpu/matvec_graph.py > $OUT/matvec_graph.csv 2>&1
tail -100 $OUT/matvec_graph.csv 2>/dev/null
