#!/usr/bin/env bash
# Build the rlsched image (Dockerfile) with podman, without a Docker engine or a registry.
#
# Usage: hack/build-image.sh [--tag IMAGE] [--base IMAGE]
#   --tag   the image to build (default localhost/rl-scheduler:dev)
#   --base  the BASE build argument (default: localhost/debian-python:bookworm, made here)
#
# The default base needs no registry (CI pulls no image), so it is made locally:
# `debootstrap --variant=minbase` of Debian bookworm with
# python3 + python3-venv, imported into podman as localhost/debian-python:bookworm. The rootfs
# tarball is cached in ${RLSCHED_IMAGE_CACHE:-$HOME/.cache/rlsched}/debian-python-bookworm.tar
# (about a minute and ~275 MB the first time). With a registry, pass --base python:3.11-slim.
#
# Build: chroot isolation and the cgroupfs manager (the default runtime cannot set rlimits on every host),
# host network so that pip reaches the package index. Prints the image's size at the end. The build
# stage stays tagged localhost/rl-scheduler-build:cache (the layer cache of the next build); untagged
# earlier images and build stages of this Dockerfile are pruned.
# Running the image on a host where podman cannot set its default rlimits (a sandboxed build host;
# tests/e2e/test_image.py does this): CONTAINERS_CONF naming a file with `[containers]` /
# `default_ulimits = []`, then
# `podman --cgroup-manager=cgroupfs run --rm --runtime /usr/sbin/runc --ulimit host --network host IMAGE ...`.
# Needs: podman, runc, debootstrap (hack/install-system-deps.sh --containers), root.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The repository root holds a folder named `operator/` (mapped to rlsched.operator). `python -m X` and
# `python -c` put the current directory first on sys.path, where that folder would shadow the standard
# library's `operator` module before site-packages load; PYTHONSAFEPATH (Python 3.11+) stops that, here
# and in every process these scripts start.
export PYTHONSAFEPATH=1

TAG=localhost/rl-scheduler:dev
BUILD_CACHE=localhost/rl-scheduler-build:cache # the Dockerfile's build stage, kept for the layer cache
BASE=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tag) TAG="${2:?--tag needs an image name}"; shift 2 ;;
    --base) BASE="${2:?--base needs an image name}"; shift 2 ;;
    *) echo "usage: $0 [--tag IMAGE] [--base IMAGE]" >&2; exit 2 ;;
  esac
done

log() { printf '[build-image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
PODMAN=(podman --cgroup-manager=cgroupfs)
for tool in podman runc; do
  command -v "${tool}" >/dev/null || { echo "build-image: ${tool} missing (hack/install-system-deps.sh --containers)" >&2; exit 2; }
done

LOCAL_BASE=localhost/debian-python:bookworm
if [[ -z "${BASE}" ]]; then
  BASE="${LOCAL_BASE}"
  if ! "${PODMAN[@]}" image exists "${LOCAL_BASE}"; then
    cache="${RLSCHED_IMAGE_CACHE:-$HOME/.cache/rlsched}"
    tarball="${cache}/debian-python-bookworm.tar"
    if [[ ! -s "${tarball}" ]]; then
      command -v debootstrap >/dev/null || { echo "build-image: debootstrap missing (hack/install-system-deps.sh --containers)" >&2; exit 2; }
      mkdir -p "${cache}"
      rootfs="$(mktemp -d "${cache}/rootfs.XXXXXX")"
      trap 'rm -rf "${rootfs}"' EXIT
      log "debootstrap bookworm (minbase + python3, python3-venv) into ${rootfs}"
      debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "${rootfs}" \
        http://deb.debian.org/debian >"${cache}/debootstrap.log" 2>&1 \
        || { tail -20 "${cache}/debootstrap.log" >&2; exit 1; }
      rm -rf "${rootfs}/var/cache/apt/archives/"*.deb "${rootfs}/var/lib/apt/lists/"*
      tar -C "${rootfs}" -cf "${tarball}.tmp" .
      mv "${tarball}.tmp" "${tarball}"
      rm -rf "${rootfs}"
      trap - EXIT
    fi
    log "importing ${tarball} as ${LOCAL_BASE}"
    "${PODMAN[@]}" import "${tarball}" "${LOCAL_BASE}" >/dev/null
  fi
fi

# pip inside the build trusts the base image's CA bundle only: behind a TLS-intercepting proxy, hand it
# the host's bundle (PIP_CERT, or pip's configured cert) through a build-time volume (not in a layer).
build_args=(--build-arg "BASE=${BASE}")
cert="${PIP_CERT:-$(pip3 config get global.cert 2>/dev/null || true)}"
if [[ -n "${cert}" && -f "${cert}" ]]; then
  build_args+=(--volume "${cert}:/etc/ssl/certs/rlsched-build-ca.crt:ro" --build-arg PIP_CERT=/etc/ssl/certs/rlsched-build-ca.crt)
fi
[[ -z "${PIP_INDEX_URL:-}" ]] || build_args+=(--build-arg "PIP_INDEX_URL=${PIP_INDEX_URL}")

log "building ${TAG} from ${BASE}"
start=$(date +%s)
# The build stage first, tagged ${BUILD_CACHE} (the full build right after reuses its layers), then the
# image. Both stages carry the label below; the prune removes the untagged images that have it: earlier
# images that lost ${TAG} and earlier build stages that lost ${BUILD_CACHE} (~670 MB each), never the
# layers this build's cache uses.
# One retry when a RUN step fails with "sealing memfd copy: Device or resource busy": the runtime seals
# an in-memory copy of itself before each step, which the kernel refuses (EBUSY) while another process
# holds a writable shared mapping of it; the step itself never ran. Any other failure stops at once.
build() {
  local status=0 errors
  errors="$(mktemp)"
  # podman's stderr is kept to look for that message, then passed on (to stderr, after the build).
  "${PODMAN[@]}" build --isolation chroot --network host "${build_args[@]}" "$@" 2>"${errors}" || status=$?
  cat "${errors}" >&2
  if [[ ${status} -ne 0 ]] && grep -q 'sealing memfd copy: Device or resource busy' "${errors}"; then
    log "a build step failed to start (sealing memfd copy: EBUSY); retrying the build once"
    status=0
    "${PODMAN[@]}" build --isolation chroot --network host "${build_args[@]}" "$@" || status=$?
  fi
  rm -f "${errors}"
  return "${status}"
}
build --target build -t "${BUILD_CACHE}" .
build -t "${TAG}" .
"${PODMAN[@]}" image prune --force --filter label=org.opencontainers.image.title=kube-rl-scheduler >/dev/null || true
log "built ${TAG} in $(( $(date +%s) - start )) s; size: $("${PODMAN[@]}" image inspect --format '{{.Size}}' "${TAG}") bytes"
