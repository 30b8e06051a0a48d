#!/usr/bin/env bash
# Lays out what these calls carried (run here, in the repository's root, before a device call
# with carry [".whl", ".gpu"]): .gpu/ with attend.sh, attn_graph.py, the two earlier kernels it
# times (their op renamed) and the commit; .whl/ with the packages decodelab imports that the
# GPU machine's image lacks (ruptures, jsonschema and its needs), for its Python 3.12.
set -euo pipefail
here=results/reference/cuda-h100/floor-fused
mkdir -p .gpu .whl
grep -qsx '/.gpu/' .git/info/exclude || echo /.gpu/ >> .git/info/exclude
grep -qsx '/.whl/' .git/info/exclude || echo /.whl/ >> .git/info/exclude
cp "$here/attend.sh" "$here/attn_graph.py" .gpu/
old() { git show "$1:src/decodelab/engines/cuda/attention.py" | sed "s/\"decodelab::attend\"/\"$2::attend\"/"; }
old 982625f old982625f > .gpu/attention_982625f.py
old 150c86a beside6bbc414 > .gpu/attention_6bbc414.py
git rev-parse HEAD > .gpu/commit
for package in ruptures jsonschema jsonschema-specifications referencing rpds-py; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "$package"
done
