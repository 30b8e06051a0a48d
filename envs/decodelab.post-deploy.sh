#!/usr/bin/env sh
# Snakemake runs this inside a conda environment it has just made (`--sdm conda`), from the
# working directory. The rules call `decodelab`, so the project goes in too: editable (the env's
# hash sees only the pins, so a copy would go stale), without dependencies (the pins are there).
set -eu
[ -f pyproject.toml ] && grep -q '^name = "decodelab"' pyproject.toml || {
  echo "post-deploy: run snakemake from the decodelab checkout (found no pyproject.toml here)" >&2
  exit 1
}
python -m pip install --quiet --no-deps -e .
