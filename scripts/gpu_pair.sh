#!/usr/bin/env bash
# The GPU pair study for the H200 reference, in one device call without Snakemake: train
# config/gpu.yaml's 24x512 target and 1x512 draft, time the speculative study (greedy and sampled,
# its K) eager and graph against the fair baseline, gpt2-xl and gpt2 fp16 (init weights) on each
# engine of the floor (scripts/gpu_pair.py's FLOOR_ENGINES) against the bandwidth floor, with each
# step split into its kernels, then the graph engine's tests on the GPU. One tarball in $OUT holds
# results/gpu-runs/cuda-h200/graph-engine/.
#   Usage: scripts/gpu_pair.sh [SECONDS (default 500)] [--smoke|""] [PARTS (default pair,bandwidth)]
# --smoke checks the logic on a CPU host: tiny models, eager only, the tarball in $OUT or /tmp.
# The earlier runs kept in the reference's run-*/ folders stay; this run's folders are replaced.
# The tests need pytest: on a host without it, carry `.whl` (its pytest, pluggy, iniconfig and
# pygments wheels are installed into /tmp/site-pytest, nothing else is touched).
# A run lands in results/gpu-runs/ (raw rows, logs); what becomes a reference is its stats/ and a
# one-page README, copied into results/reference/<name>/ (results/reference/README.md).
set -uo pipefail
deadline=$((SECONDS + ${1:-500}))
smoke=${2:-}
parts=${3:-pair,bandwidth}
out=${OUT:-/tmp/gpu_pair_out}
python=${PYTHON:-python3}
ref=results/gpu-runs/cuda-h200/graph-engine
models=${MODELS:-/tmp/gpu_pair_models}
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TQDM_DISABLE=1
# The config checks need jsonschema, which a bare device image may lack: carried in `.whl` too.
if ! $python -c "import jsonschema" 2>/dev/null && ls .whl/jsonschema-*.whl >/dev/null 2>&1; then
  $python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-schema \
    .whl/jsonschema-*.whl .whl/jsonschema_specifications-*.whl .whl/referencing-*.whl .whl/rpds_py-*.whl
  export PYTHONPATH=/tmp/site-schema:$PYTHONPATH
fi
left() { echo $((deadline - SECONDS - $1)); }

rm -rf "$ref"/{logs,models,raw,stats} && mkdir -p "$ref/logs" "$out"
{ date -u; git rev-parse HEAD 2>/dev/null; nvidia-smi 2>&1 | head -15
  $python -c "import torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__, 'cuda', torch.cuda.is_available())"; } >"$ref/logs/env.txt" 2>&1
cat "$ref/logs/env.txt"

# The measurements, leaving 70 s for the tests and the tarball.
timeout -s INT "$(left 60)" $python scripts/gpu_pair.py --deadline "$(left 70)" --out "$ref" \
  --models "$models" --parts "$parts" $smoke 2>&1 | grep --line-buffered -v -E '[0-9]+%\|' | tee "$ref/logs/run.log"

tests=$ref/logs/test_graphs.txt
if ! $python -c "import pytest" 2>/dev/null && ls .whl/pytest-*.whl >/dev/null 2>&1; then
  $python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-pytest \
    .whl/pytest-*.whl .whl/pluggy-*.whl .whl/iniconfig-*.whl .whl/pygments-*.whl
fi
# --noconftest: the suite's conftest needs Snakemake; these tests need none of it.
PYTHONPATH=/tmp/site-pytest:$PYTHONPATH timeout "$(left 10)" $python -m pytest \
  tests/test_graphs.py --noconftest -p no:cacheprovider -q -rs >"$tests" 2>&1
echo "exit status $?" >>"$tests"
tail -n 12 "$tests"

tar czf "$out/graph-engine.tgz" "$ref" && ls -la "$out"
echo "left: $((deadline - SECONDS)) s"
