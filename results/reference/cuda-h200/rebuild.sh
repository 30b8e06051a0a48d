#!/usr/bin/env bash
# Rebuild this reference run's tidy tables and figures from raw/ on any machine (no GPU), with the
# DAG's CLI verbs in the DAG's order and config/gpu.yaml's statistics and stability settings. The
# run's own statistics jobs were cut short by the GPU session's end (README.md); the measurements
# were not. Run from the repo root: results/reference/cuda-h200/rebuild.sh [OUT]
# OUT (default: this directory) receives stats/ and figures/; the committed ones were written by
# an earlier version of these verbs (before the stability verdicts), so rebuild elsewhere to compare.
set -euo pipefail
R=results/reference/cuda-h200
O=${1:-$R}
S=$O/stats F=$O/figures
# what the DAG's rules pass: settings SECTION [METHOD (default job_spec)]
settings() { python3 -c "import json, sys; from decodelab.config.settings import load_settings
section = getattr(load_settings('config/gpu.yaml'), sys.argv[1])
print(json.dumps(getattr(section, sys.argv[2])(), sort_keys=True))" "$1" "${2:-job_spec}"; }
sweeps=$(ls "$R"/raw/cuda/{sweep,ablation}/*/rep*.parquet)
speculative=$(ls "$R"/raw/speculative/*/rep*.parquet)
parallelism=$(ls "$R"/raw/cuda/parallelism/target/rep*.parquet)
rm -rf "$S" "$F" && mkdir -p "$S" "$F"
decodelab collect --host cuda-h200 --out "$O/runs.parquet" --environment "$S/environment.csv" $sweeps
for study in sweep speculative parallelism; do
  case $study in sweep) runs=$sweeps ;; speculative) runs=$speculative ;; *) runs=$parallelism ;; esac
  decodelab verdicts --study $study --spec "$(settings stability)" --out "$S/verdicts_$study.csv" $runs
done
decodelab stats --runs "$O/runs.parquet" --spec "$(settings stats)" --verdicts "$S/verdicts_sweep.csv" \
  --latency "$S/latency.csv" --kv "$S/kv_speedup.csv"
decodelab regimes --runs "$O/runs.parquet" --spec "$(settings regimes rule_spec)" --verdicts "$S/verdicts_sweep.csv" \
  --out "$S/regimes.csv"
decodelab regime-depth --runs "$O/runs.parquet" --regimes "$S/regimes.csv" --spec "$(settings regimes)" --out "$S"
decodelab spec-stats --spec "$(settings stats)" --verdicts "$S/verdicts_speculative.csv" --out "$S" \
  --runs $speculative --parallelism $parallelism
decodelab verify-stats --out "$S" "$R"/raw/verification/*.json
decodelab selection --runs "$O/runs.parquet" --speculative $speculative --spec "$(settings stats)" \
  --regimes "$(settings regimes rule_spec)" --out "$S/selection.csv"
decodelab model-table --out "$S/models.csv" "$R"/models/*
decodelab benchmarks --out "$S/benchmarks.csv" $(find "$R/benchmarks" -name '*.tsv' | sort)
decodelab figures --stats "$S" --out "$F"
decodelab spec-figures --stats "$S" --out "$F"
decodelab verify-figures --stats "$S" --out "$F"
