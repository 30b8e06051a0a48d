#!/usr/bin/env bash
# How long `snakemake -n` takes on the default config here against an older commit, measured
# side by side: the runs alternate, old then new, ROUNDS times, in one process tree on one
# machine, each workflow importing its own commit's src/ (PYTHONPATH before the editable
# install). Prints the medians and their ratio and writes them to results/bench/dag_dry_run.csv.
#   Usage: scripts/dag_speed.sh [OLD_COMMIT (default 2cae45d^, the workflow before its one
#          registry of statistics tables)] [ROUNDS (default 5)]
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:-2cae45d^}
rounds=${2:-5}
snakemake=${SNAKEMAKE:-$PWD/.venv/bin/snakemake}
tree=$(mktemp -d /tmp/dag_speed.XXXXXX)
trap 'git worktree remove --force "$tree" >/dev/null 2>&1 || rm -rf "$tree"' EXIT
git worktree add --detach -q "$tree" "$old"

dry_run() {  # $1: the workflow's directory; prints the seconds one dry run took
  local start end
  start=$(date +%s.%N)
  (cd "$1" && PYTHONPATH="$1/src" "$snakemake" -n --quiet >/dev/null 2>&1) \
    || { echo "snakemake -n failed in $1" >&2; exit 1; }
  end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" 'BEGIN { print b - a }'
}

rows=()
for round in $(seq "$rounds"); do
  rows+=("old,$round,$(dry_run "$tree")" "new,$round,$(dry_run "$PWD")")
done
mkdir -p results/bench
{ echo "workflow,round,seconds"; printf '%s\n' "${rows[@]}"; } >results/bench/dag_dry_run_runs.csv
"$PWD/.venv/bin/python" - "$(git rev-parse --short "$old")" "$(git rev-parse --short HEAD)" <<'EOF'
import sys
import pandas as pd
old, new = sys.argv[1:]
runs = pd.read_csv("results/bench/dag_dry_run_runs.csv")
median = runs.groupby("workflow")["seconds"].median()
out = pd.DataFrame([{"old_commit": old, "new_commit": new, "rounds": runs["round"].max(),
                     "old_median_s": median["old"], "new_median_s": median["new"],
                     "speedup": median["old"] / median["new"]}])
out.to_csv("results/bench/dag_dry_run.csv", index=False)
print(out.to_string(index=False))
EOF
