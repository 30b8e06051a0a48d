#!/usr/bin/env bash
# The DAG's speculative tables of this run, from raw/ and models/ on any machine (no GPU), with
# config/gpu.yaml's statistics and stability settings: what `reference_comparison` and the paper
# read. stats/pair.csv, divergence.csv and bandwidth.csv are scripts/gpu_pair.py's own.
# Run from the repo root: results/reference/cuda-h200/graph-engine/rebuild.sh
set -euo pipefail
R=results/reference/cuda-h200/graph-engine
settings() { python3 -c "import json, sys; from decodelab.config import load_settings
print(json.dumps(getattr(load_settings('config/gpu.yaml'), sys.argv[1]).job_spec(), sort_keys=True))" "$1"; }
decodelab verdicts --study speculative --spec "$(settings stability)" \
  --out "$R/stats/verdicts_speculative.csv" "$R"/raw/speculative/*/rep0.parquet
decodelab spec-stats --spec "$(settings stats)" --verdicts "$R/stats/verdicts_speculative.csv" \
  --out "$R/stats" --runs "$R"/raw/speculative/*/rep0.parquet
decodelab model-table --out "$R/stats/models.csv" "$R"/models/*
