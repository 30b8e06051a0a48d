#!/usr/bin/env bash
# Rebuild this reference's tables from raw/ on any machine (no GPU), with the DAG's `long-stats`
# verb and config/long.yaml's statistics settings. Run from the repo root:
#   results/reference/cuda-h200/long/rebuild.sh
set -euo pipefail
R=results/reference/cuda-h200/long
spec=$(python3 -c "import json; from decodelab.config.settings import load_settings
print(json.dumps(load_settings('config/long.yaml').stats.job_spec(), sort_keys=True))")
decodelab long-stats --spec "$spec" --out "$R/stats" --runs "$R"/raw/long/*.parquet
decodelab model-table --out "$R/stats/models.csv" "$R"/models/*
