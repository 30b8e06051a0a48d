#!/usr/bin/env bash
# s44: gpt2-xl on `fused` against the floor, the cache and graph-engine tests (with the
# MatvecLinear fix), attention.SHARED_ROWS timed (shared_rows.py),
# a layer norm folded into the next product timed (ln_fold.py), then `layered` in what is left.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 TQDM_DISABLE=1
END=$((SECONDS + ${1:-500}))
cp .gpu/commit $OUT/commit.txt
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name())" | tee $OUT/versions.txt
nvidia-smi --query-gpu=name,serial,clocks.max.memory,clocks.max.sm,memory.total --format=csv >> $OUT/versions.txt 2>&1
floor() {  # engine, folder, seconds
  mkdir -p $OUT/$2
  timeout $3 python3 scripts/gpu_pair.py --deadline $(($3 - 5)) --out $OUT/$2 --parts bandwidth \
    --floor-engines $1 2>&1 | grep -v USDT | tee $OUT/$2/run.log | grep "ms/token\|warm-up\|Error\|error" | cut -c1-300
}
floor fused fused 230
timeout ${TESTS_S:-200} python3 -m pytest tests/test_static_cache.py tests/test_graphs.py --noconftest -p no:cacheprovider -q -rs -k "static_cache or (fused and not refused)" --durations=5 -p no:logging > $OUT/tests.txt 2>&1; echo "exit $?" >> $OUT/tests.txt
tail -4 $OUT/tests.txt
timeout ${SHARED_S:-70} python3 .gpu/shared_rows.py > $OUT/shared_rows.csv 2>&1; cat $OUT/shared_rows.csv | cut -c1-160
timeout ${FOLD_S:-80} python3 .gpu/ln_fold.py > $OUT/ln_fold.csv 2>&1; tail -8 $OUT/ln_fold.csv | cut -c1-200
LEFT=$((END - SECONDS - 3)); [ $LEFT -gt 60 ] && floor layered layered $((LEFT < 230 ? LEFT : 230))
