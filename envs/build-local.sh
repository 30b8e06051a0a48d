#!/usr/bin/env bash
# Build an image with Podman on a machine that reaches PyPI and Debian but no container
# registry (like CI's): the base is Debian bookworm made with debootstrap and imported, the CPU
# image's torch comes from a local wheel directory (the CUDA image's from PyPI), pip uses this
# host's settings (CA bundle, pip.conf) during the build only. Reruns take seconds: the base is
# kept and Podman reuses cached layers.
#   envs/build-local.sh            -> localhost/decodelab-cpu:local
#   envs/build-local.sh cuda       -> localhost/decodelab-cuda:local  (`make cuda-image`, GBs)
# Needs root (debootstrap), podman, runc and debootstrap (`make container-image` and `make
# cuda-image` install them).
set -euo pipefail
cd "$(dirname "$0")/.."

export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/envs/podman/containers.conf}"
KIND=${1:-cpu}
case "$KIND" in
  cpu | cuda) ;;
  *) echo "build-local: no image '$KIND': build 'cpu' (the default) or 'cuda'" >&2; exit 2 ;;
esac
for tool in podman debootstrap; do
  command -v "$tool" > /dev/null \
    || { echo "build-local: $tool is not installed (apt-get install podman runc debootstrap)" >&2; exit 1; }
done
BASE=${BASE:-localhost/decodelab-base:bookworm}
IMAGE=${IMAGE:-localhost/decodelab-$KIND:local}
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
  # The local wheels are CPU builds; the CUDA image takes PyPI's torch, which is the CUDA one.
  [ "$KIND" = cpu ] || return 0
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
  -f "envs/$KIND.Containerfile" -t "$IMAGE" .
# Each rebuild leaves the previous image untagged; keep the layer cache from growing.
podman image prune --force > /dev/null
