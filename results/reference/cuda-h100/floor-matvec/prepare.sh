#!/usr/bin/env bash
# Lays out what these calls carried (run here, in the repository's root, before a device call
# with carry [".whl", ".gpu"]): floor-fused's layout (.whl/, the wheels the GPU image lacks), and
# .gpu/ with matvec.sh and matvec_graph.py. Then, on the device: bash .gpu/matvec.sh SECONDS.
set -euo pipefail
bash results/reference/cuda-h100/floor-fused/prepare.sh
cp results/reference/cuda-h100/floor-matvec/matvec.sh results/reference/cuda-h100/floor-matvec/matvec_graph.py .gpu/
