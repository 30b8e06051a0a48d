#!/usr/bin/env bash
# Rebuild this reference's tables from its raw files on any machine (no GPU), with the DAG's
# `batched-stats` verb and config.yaml's statistics settings. Run from the repo root:
#   results/reference/cuda-h200/batched-trained/rebuild.sh
set -euo pipefail
R=results/reference/cuda-h200/batched-trained
spec=$(python3 -c "import json; from decodelab.config.settings import load_settings
print(json.dumps(load_settings('config.yaml').stats.job_spec(), sort_keys=True))")
decodelab batched-stats --spec "$spec" --out "$R/stats" --runs "$R/throughput.parquet" \
  --costs "$R/costs.parquet"
