#!/usr/bin/env bash
# Rebuild this reference's tables from its raw files on any machine (no GPU), with the DAG's
# `batched-stats` verb and config.yaml's statistics settings. The runs predate the kv_budget
# column: their self-drafts' view was 64 tokens (scripts/gpu_batched.sh at 339c62c,
# --policy-budget 64). Run from the repo root:
#   results/reference/cuda-h200/batched/rebuild.sh
set -euo pipefail
R=results/reference/cuda-h200/batched
spec=$(python3 -c "import json; from decodelab.config import load_settings
print(json.dumps(load_settings('config.yaml').stats.job_spec(), sort_keys=True))")
decodelab batched-stats --spec "$spec" --out "$R/stats" --runs "$R/throughput.parquet" \
  --costs "$R/costs.parquet" --kv-budget 64
