#!/usr/bin/env bash
# The DAG's speculative tables of this run (stats/), from raw/ and models/ on any machine (no GPU).
# stats/pair.csv, divergence.csv and bandwidth.csv are scripts/gpu_pair.py's own.
# Run from the repo root: results/reference/cuda-h200/graph-engine/rebuild.sh
exec scripts/spec_tables.sh results/reference/cuda-h200/graph-engine 'rep0'
