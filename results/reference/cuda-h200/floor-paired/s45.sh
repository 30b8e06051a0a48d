#!/usr/bin/env bash
# s45, call 1 (ran on an H200, call1/): gpt2-xl on `fused` against the floor (#18's target
# where the card is an H200) and, in the same process, on `fused-deterministic` (no reduction
# tuned per process: does that cost time, and do its greedy tokens stay with eager's?); then the
# attention tests and the cache and graph-engine tests with a verification's rows in one program
# per head as the default (attention.shares_rows).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 TQDM_DISABLE=1
cp .gpu/commit $OUT/commit.txt
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name())" | tee $OUT/versions.txt
nvidia-smi --query-gpu=name,serial,clocks.max.memory,clocks.max.sm,memory.total --format=csv >> $OUT/versions.txt 2>&1
floor() {  # engine, folder, seconds
  mkdir -p $OUT/$2
  timeout $3 python3 scripts/gpu_pair.py --deadline $(($3 - 5)) --out $OUT/$2 --parts bandwidth \
    --floor-engines $1 2>&1 | grep -v USDT | tee $OUT/$2/run.log | grep "ms/token\|warm-up\|Error\|error" | cut -c1-300
}
floor fused,fused-deterministic fused 340
timeout 60 python3 -m pytest tests/test_attention.py --noconftest -p no:cacheprovider -q -rs -p no:logging --durations=3 > $OUT/test_attention.txt 2>&1; echo "exit $?" >> $OUT/test_attention.txt
tail -4 $OUT/test_attention.txt
timeout ${TESTS_S:-150} python3 -m pytest tests/test_static_cache.py tests/test_graphs.py --noconftest -p no:cacheprovider -q -rs -k "static_cache or (fused and not refused)" --durations=5 -p no:logging > $OUT/tests.txt 2>&1; echo "exit $?" >> $OUT/tests.txt
tail -4 $OUT/tests.txt
