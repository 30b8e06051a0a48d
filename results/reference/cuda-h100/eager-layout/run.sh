#!/usr/bin/env bash
# Eager gpt2 decoding, one process at a time, N per condition, interleaved: `default` (the address
# space and Python's hash seed drawn anew in each process, as every earlier sweep ran) and `fixed`
# (PYTHONHASHSEED=0 under `setarch -R`: every process lays out its memory and its dicts alike).
# On the device, from the repository's root: bash results/reference/cuda-h100/eager-layout/run.sh
# [SECONDS [N]]. Writes $OUT/eager_layout.jsonl, one line per process.
set -uo pipefail
here=results/reference/cuda-h100/eager-layout
end=$((SECONDS + ${1:-200}))
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)" > $OUT/versions.txt
nvidia-smi --query-gpu=name,serial,clocks.max.sm --format=csv >> $OUT/versions.txt
lscpu > $OUT/lscpu.txt
fixed="env PYTHONHASHSEED=0 setarch $(uname -m) -R"
command -v setarch > /dev/null || { echo "no setarch: fixed is the hash seed alone" | tee -a $OUT/versions.txt; fixed="env PYTHONHASHSEED=0"; }
for i in $(seq ${2:-8}); do
  for condition in default fixed; do
    [ $SECONDS -lt $end ] || break 2
    if [ $condition = fixed ]; then run=$fixed; else run=env; fi
    line=$($run python3 $here/eager_layout.py 2>> $OUT/stderr.txt | tail -1)
    echo "{\"condition\": \"$condition\", \"process\": $i, \"result\": ${line:-null}}" | tee -a $OUT/eager_layout.jsonl
  done
done
