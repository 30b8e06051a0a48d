#!/usr/bin/env bash
# The DAG's speculative tables of this run (stats/), from raw/ and models/ on any machine (no GPU).
# Run from the repo root: results/reference/cuda-h100/fused-verdict/study/rebuild.sh
exec scripts/spec_tables.sh results/reference/cuda-h100/fused-verdict/study 'rep*' cuda-h100
