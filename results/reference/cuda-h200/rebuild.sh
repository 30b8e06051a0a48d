#!/usr/bin/env bash
# Rebuild this reference run's tidy tables and figures from raw/ on any machine (no GPU), with the
# DAG's CLI verbs in the DAG's order and config/gpu.yaml's statistics settings. The run's own
# statistics jobs were cut short by the GPU session's end (README.md); the measurements were not.
# Run from the repo root: results/reference/cuda-h200/rebuild.sh
set -euo pipefail
R=results/reference/cuda-h200
spec() { python3 -c "import json,sys,yaml; print(json.dumps(yaml.safe_load(open('config/gpu.yaml'))[sys.argv[1]], sort_keys=True))" "$1"; }
rm -rf "$R/stats" "$R/figures" && mkdir -p "$R/stats" "$R/figures"
decodelab collect --host cuda-h200 --out "$R/runs.parquet" --environment "$R/stats/environment.csv" \
  $(ls "$R"/raw/cuda/{sweep,ablation}/*/rep*.parquet)
decodelab stats --runs "$R/runs.parquet" --spec "$(spec stats)" --latency "$R/stats/latency.csv" --kv "$R/stats/kv_speedup.csv"
decodelab regimes --runs "$R/runs.parquet" --spec "$(spec regimes)" --out "$R/stats/regimes.csv"
decodelab regime-depth --runs "$R/runs.parquet" --regimes "$R/stats/regimes.csv" --spec "$(spec regimes)" --out "$R/stats"
decodelab spec-stats --spec "$(spec stats)" --out "$R/stats" --runs "$R"/raw/speculative/*/rep*.parquet \
  --parallelism "$R"/raw/cuda/parallelism/target/rep*.parquet
decodelab verify-stats --out "$R/stats" "$R"/raw/verification/*.json
decodelab selection --runs "$R/runs.parquet" --speculative "$R"/raw/speculative/*/rep*.parquet \
  --spec "$(spec stats)" --regimes "$(spec regimes)" --out "$R/stats/selection.csv"
decodelab model-table --out "$R/stats/models.csv" "$R"/models/*
decodelab benchmarks --out "$R/stats/benchmarks.csv" $(find "$R/benchmarks" -name '*.tsv' | sort)
decodelab figures --stats "$R/stats" --out "$R/figures"
decodelab spec-figures --stats "$R/stats" --out "$R/figures"
decodelab verify-figures --stats "$R/stats" --out "$R/figures"
