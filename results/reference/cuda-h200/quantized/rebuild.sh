#!/bin/sh
# Rebuilds stats/ from raw/ with decodelab's own verbs (as scripts/quantized_cuda.sh ran them on
# the H200), adding llama.cpp's own speculative runs (raw/llama.cpp-peer/, the same trained pair:
# see README.md) to the peer table.
set -eu
cd "$(dirname "$0")/../../../.."
q=results/reference/cuda-h200/quantized
ci='{"confidence": 0.95, "bootstrap_resamples": 2000, "seed": 7}'
spec=$(ls $q/raw/speculative/*/rep*.parquet)
decodelab verdicts --study speculative --spec '{}' --out $q/stats/verdicts_speculative.csv $spec
decodelab verdicts --study parallelism --spec '{}' --out $q/stats/verdicts_parallelism.csv \
	$q/raw/*/parallelism/*/rep*.parquet
decodelab spec-stats --spec "$ci" --verdicts $q/stats/verdicts_speculative.csv --out $q/stats \
	--runs $spec --parallelism $q/raw/cuda/parallelism/*/rep*.parquet
decodelab quantized-stats --spec "$ci" --stats $q/stats --out $q/stats \
	--verdicts $q/stats/verdicts_parallelism.csv --verify-cost $q/raw/llama.cpp-*/parallelism/*/rep*.parquet \
	--runs $spec --peer $q/raw/llama.cpp-peer/*/rep*.parquet
