#!/usr/bin/env bash
# The paper-offline DAG end to end to the PDF with its amounts shrunk so that it finishes in about
# half an hour of one core: the same jobs, models and shapes (config/paper-offline.yaml), fewer
# budgets, repeats, Ks, prompts, tokens and training steps. Most of its time is the real shapes'
# per-token cost (float16 cache-off decoding of bloom-560m, the 1-1.5B targets' forwards), so the
# amounts are near their smallest. Runs in a copy of the workflow (default: a new directory under
# /tmp), one core, lowest priority; each job's wall time and peak memory land in
# <copy>/benchmarks/ (ARTIFACT.md: The paper profile, offline).
# Usage: scripts/paper_offline_smoke.sh [DIR] [extra snakemake arguments, e.g. -n]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$(mktemp -d /tmp/paper-offline-smoke.XXXXXX)}
shift || true
mkdir -p "$dest"
for name in Snakefile config.yaml config workflow paper profiles envs; do
  cp -a "$root/$name" "$dest/"
done
cd "$dest"
echo "paper-offline smoke run in $dest" >&2
# Snakemake reads --config values as strings, so the shrunk amounts are a second config file,
# merged key by key over the profile.
cat > smoke.yaml <<'YAML'
sweep: {budgets: [2, 3, 4], prompt_lengths: [2, 4], repeats: 2, inner_repeats: 1, warmup: 1}
speculative: {ks: [1, 2], prompts: 1, prompt_len: 4, budget: 4, repeats: 2,
              parallelism: {ks: [1, 2], context: 8, inner: 1}}
verification:
  seeds: 3
  exact: {random_pairs: 20, real_positions: 30, block_ks: [1, 2]}
  monte_carlo: {draws: 2000, block_draws: 1000}
  real: {tokens: 200, budget: 16, top: 50, prompts: 2, power_tokens: 200, greedy_prompts: 2}
models: {target: {corpus_mb: 2, steps: 150}, draft: {corpus_mb: 2, steps: 100}}
stats: {bootstrap_resamples: 1000}
YAML
export PATH="$root/.venv/bin:$PATH"  # the rules call decodelab
exec nice -n 19 snakemake --cores 1 \
  --configfiles config/paper-offline.yaml smoke.yaml "$@"
