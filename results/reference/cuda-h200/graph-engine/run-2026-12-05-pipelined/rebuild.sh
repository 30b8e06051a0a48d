#!/usr/bin/env bash
# The DAG's speculative tables of this run (stats/), from raw/ and models/ on any machine (no GPU),
# with config/gpu.yaml's statistics and stability settings.
# Run from the repo root: results/reference/cuda-h200/graph-engine/run-2026-12-05-pipelined/rebuild.sh
set -euo pipefail
R=results/reference/cuda-h200/graph-engine/run-2026-12-05-pipelined
settings() { python3 -c "import json, sys; from decodelab.config import load_settings
print(json.dumps(getattr(load_settings('config/gpu.yaml'), sys.argv[1]).job_spec(), sort_keys=True))" "$1"; }
mkdir -p "$R/stats"
decodelab verdicts --study speculative --spec "$(settings stability)" \
  --out "$R/stats/verdicts_speculative.csv" "$R"/raw/speculative/*/rep*.parquet
decodelab spec-stats --spec "$(settings stats)" --verdicts "$R/stats/verdicts_speculative.csv" \
  --out "$R/stats" --runs "$R"/raw/speculative/*/rep*.parquet
decodelab model-table --out "$R/stats/models.csv" "$R"/models/*
