#!/usr/bin/env bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  .whl/transformers-5.24.0-py3-none-any.whl .whl/nvidia_ml_py-*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -c "import transformers, torch; print(transformers.__version__, torch.__version__)"
nproc; cat /sys/fs/cgroup/cpu.max 2>/dev/null
timeout 400 python3 results/reference/cuda-h200/diagnostics/scripts/diag.py "${1:-270}" 2>&1 | grep -v Warning
nvidia-smi -q -d PERFORMANCE | head -30
