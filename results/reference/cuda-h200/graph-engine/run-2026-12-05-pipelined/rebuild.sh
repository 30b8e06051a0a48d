#!/usr/bin/env bash
# The DAG's speculative tables of this run (stats/), from raw/ and models/ on any machine (no GPU).
# Run from the repo root: results/reference/cuda-h200/graph-engine/run-2026-12-05-pipelined/rebuild.sh
exec scripts/spec_tables.sh results/reference/cuda-h200/graph-engine/run-2026-12-05-pipelined 'rep*'
