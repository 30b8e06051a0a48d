#!/usr/bin/env bash
# A stand-in for `apptainer` in tests, where only Podman exists. Snakemake's `--sdm apptainer`
# calls `apptainer [--quiet --silent] exec --home DIR [--nv] [--bind PATH]... IMAGE SHELL -c CMD`;
# this runs the same SHELL -c CMD with Podman in the image whose name the IMAGE file holds
# (binding DIR and each PATH at the same place), and appends each call to $FAKE_APPTAINER_LOG.
set -euo pipefail
if [ "${1:-}" = --version ]; then
  echo "apptainer version 1.3.6"
  exit 0
fi
echo "$*" >> "${FAKE_APPTAINER_LOG:?}"
while [ "$1" != exec ]; do shift; done
shift
mounts=()
while [[ "$1" == --* ]]; do
  case "$1" in
    --home | --bind) mounts+=(--volume "$2:$2"); shift 2 ;;
    --pwd) shift 2 ;;
    *) shift ;;  # --nv and other flags without a value
  esac
done
image=$(cat "$1")
shift
exec podman run --rm --network none "${mounts[@]}" --workdir "$PWD" "$image" "$@"
