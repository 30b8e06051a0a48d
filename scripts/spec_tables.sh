#!/usr/bin/env bash
# The DAG's speculative tables of a run made apart from the DAG (DIR/stats/), from its raw rows
# (DIR/raw/speculative/<pair>/RUNS.parquet) and DIR/models/, on any machine (no GPU), with
# config/gpu.yaml's statistics and stability settings. HOST: also DIR/stats/environment.csv, the
# rows' machine under that name (a reference of its own rather than a sub-study of one).
#   Usage, from the repo root: scripts/spec_tables.sh DIR [RUNS (default rep*) [HOST]]
set -euo pipefail
R=$1 runs=${2:-rep*} host=${3:-}
settings() { python3 -c "import json, sys; from decodelab.config.settings import load_settings
print(json.dumps(getattr(load_settings('config/gpu.yaml'), sys.argv[1]).job_spec(), sort_keys=True))" "$1"; }
mkdir -p "$R/stats"
decodelab verdicts --study speculative --spec "$(settings stability)" \
  --out "$R/stats/verdicts_speculative.csv" "$R"/raw/speculative/*/$runs.parquet
decodelab spec-stats --spec "$(settings stats)" --verdicts "$R/stats/verdicts_speculative.csv" \
  --out "$R/stats" --runs "$R"/raw/speculative/*/$runs.parquet
decodelab model-table --out "$R/stats/models.csv" "$R"/models/*
[ -z "$host" ] || python3 -c "import sys; import pandas as pd; from decodelab.analysis.stats import environment_table
runs = pd.concat(pd.read_parquet(p) for p in sorted(sys.argv[3:]))
environment_table(runs.assign(host=sys.argv[2])).to_csv(sys.argv[1], index=False)" \
  "$R/stats/environment.csv" "$host" "$R"/raw/speculative/*/$runs.parquet
