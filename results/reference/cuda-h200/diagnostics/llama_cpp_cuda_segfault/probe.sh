#!/usr/bin/env bash
# Build llama-cpp-python with CUDA once (kept in .gpu/wheels on a warm machine), then probe where
# llama.cpp on CUDA segfaults: without torch, after torch's CUDA init, through decodelab's Engine.
set -uo pipefail
export PYTHONUNBUFFERED=1
cmake_args="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF"
mkdir -p $OUT/p
if ! ls .gpu/wheels/llama_cpp_python-*.whl >/dev/null 2>&1; then
  echo "[$(date +%T)] build"; mkdir -p .gpu/wheels
  CMAKE_ARGS=$cmake_args CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip wheel --no-deps \
    --no-build-isolation --no-index -w .gpu/wheels -C build-dir=$PWD/.gpu/build .gpu/llama-src \
    >$OUT/p/build.log 2>&1 || { tail -30 $OUT/p/build.log; exit 1; }
fi
echo "[$(date +%T)] install"
python3 -m pip install -q --no-deps --no-index --target /tmp/site .gpu/wheels/llama_cpp_python-*.whl .gpu/whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src DECODELAB_LLAMA_CONVERTER=$PWD/.gpu/llama-src/vendor/llama.cpp
ls /tmp/site/llama_cpp/lib/ ; ldd /tmp/site/llama_cpp/lib/libggml-cuda.so | grep -i "cu\|not found"
python3 -c "import torch, glob, os; print(torch.__version__, torch.version.cuda); print(glob.glob(os.path.dirname(torch.__file__)+'/../nvidia/*/lib/libcublas*'))"
if [ ! -e /tmp/g/F16.gguf ]; then
python3 -m decodelab.cli prepare-model --out /tmp/m --spec '{"source": "init", "preset": "gpt2-tiny", "seed": 1}' >$OUT/p/prep.log 2>&1 || tail $OUT/p/prep.log
python3 -m decodelab.cli convert-gguf --model-dir /tmp/m --type F16 --out-dir /tmp/g >$OUT/p/conv.log 2>&1 || tail $OUT/p/conv.log
fi
ls -la /tmp/g
cat >/tmp/probe.py <<'PY'
import sys
mode = sys.argv[1]
if mode in ("torch", "torchcuda"):
    import torch
    if mode == "torchcuda":
        torch.zeros(1, device="cuda"); print("torch cuda up", flush=True)
import llama_cpp
l = llama_cpp.Llama("/tmp/g/F16.gguf", n_gpu_layers=-1, logits_all=True, verbose=True, n_ctx=0)
print("loaded", flush=True)
l.eval([1, 2, 3, 4]); print("eval", l.scores[:4].sum(), flush=True)
l._ctx.kv_cache_seq_rm(-1, 2, -1); l.n_tokens = 2; l.eval([5]); print("OK", mode, flush=True)
PY
for m in plain torch torchcuda; do echo "== $m"; timeout 60 python3 -X faulthandler /tmp/probe.py $m >$OUT/p/probe_$m.log 2>&1; echo "rc=$?"; grep -v "^llama_model_loader\|^print_info\|^load_tensors:  *\|^llama_context\|^llama_kv" $OUT/p/probe_$m.log | tail -25; done
echo "== engine"; timeout 60 python3 -X faulthandler -c "
from decodelab.backends.llamacpp import Engine; import torch
e = Engine('/tmp/g/F16.gguf', device='cuda'); c = e.new_cache()
print(e(torch.tensor([[1,2,3]]), past_key_values=c).logits.shape); c.crop(-1); print('OK engine')" 2>&1 | tail -25
tar czf $OUT/probe.tgz -C $OUT p
