#!/usr/bin/env bash
# Build the CPU image with Podman on a machine that reaches PyPI and Debian but no container
# registry (like CI's): the base is Debian bookworm made with debootstrap and imported, torch
# comes from a local wheel directory, pip uses this host's settings (CA bundle, pip.conf) during
# the build only. Reruns take seconds: the base is kept and Podman reuses cached layers.
#   envs/build-local.sh            -> localhost/decodelab-cpu:local
# Needs root (debootstrap), podman, runc and debootstrap (`make container-image` installs them).
set -euo pipefail
cd "$(dirname "$0")/.."

export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/envs/podman/containers.conf}"
BASE=${BASE:-localhost/decodelab-base:bookworm}
IMAGE=${IMAGE:-localhost/decodelab-cpu:local}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
WHEELS=${WHEELS:-${PIP_FIND_LINKS:-/opt/wheels}}

build_base() {
  local root
  root=$(mktemp -d)
  trap 'rm -rf "$root"' RETURN
  echo "build-local: debootstrap bookworm into $root (about a minute)" >&2
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$root" "$MIRROR" > "$root.log" 2>&1 || { cat "$root.log" >&2; return 1; }
  rm -f "$root.log"
  tar -C "$root" -c . | podman import --change 'CMD ["/bin/bash"]' - "$BASE" > /dev/null
}

host_pip_mounts() {
  # The host's pip settings and CA bundle, so that pip inside reaches PyPI as pip here does.
  local f
  for f in /etc/pip.conf /etc/ssl/certs/ca-certificates.crt; do
    [ -f "$f" ] && printf -- '--volume=%s:%s:ro\n' "$f" "$f"
  done
  return 0
}

torch_source() {
  if compgen -G "$WHEELS/torch-*.whl" > /dev/null; then
    printf -- '--build-arg=TORCH_SOURCE=--no-index --find-links /wheels\n'
    printf -- '--volume=%s:/wheels:ro\n' "$WHEELS"
  fi
}

podman image exists "$BASE" || build_base
mapfile -t extra < <(host_pip_mounts; torch_source)
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- src pyproject.toml requirements.lock 2>/dev/null || commit+=-dirty
podman build --network host --build-arg "BASE=$BASE" --build-arg "GIT_COMMIT=$commit" \
  "${extra[@]}" \
  -f envs/cpu.Containerfile -t "$IMAGE" .
# Each rebuild leaves the previous image untagged; keep the layer cache from growing.
podman image prune --force > /dev/null
