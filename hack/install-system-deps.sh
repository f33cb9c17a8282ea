#!/usr/bin/env bash
# Installs the Debian packages the local control plane and its checks need.
# Idempotent: when every package is already installed it exits at once, without
# touching apt (no `apt-get update`).
#
# Usage: hack/install-system-deps.sh [--containers]
#   --containers   also podman, runc, debootstrap (container image work, see docs)
# Needs root (or sudo) and Debian's package mirrors.
set -euo pipefail

usage() { sed -n '6,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

PACKAGES=(
  openssl        # CA, serving and client certificates (hack/local-cluster.sh)
  shellcheck     # lint for hack/*.sh
  prometheus     # scrapes the per-node load exporter (hack/local-cluster.sh up)
  iproute2       # ss: port checks in hack/local-cluster.sh
  procps         # ps/pkill-free process checks
  util-linux     # flock, setsid
  curl           # readiness probes
  ca-certificates
  python3-venv   # ensurepip for `python3 -m venv .venv` (without it Debian's venv has no pip)
)
case "${1:-}" in
  "") ;;
  --containers) PACKAGES+=(podman runc debootstrap) ;;
  -h|--help) usage; exit 0 ;;
  *) usage >&2; exit 2 ;;
esac
if [[ $# -gt 1 ]]; then usage >&2; exit 2; fi

missing=()
for p in "${PACKAGES[@]}"; do
  if [[ "$(dpkg-query -W -f='${db:Status-Status}' "${p}" 2>/dev/null || true)" != "installed" ]]; then
    missing+=("${p}")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "[install-system-deps] all installed: ${PACKAGES[*]}"
  exit 0
fi

SUDO=()
if [[ "$(id -u)" -ne 0 ]]; then
  if ! command -v sudo >/dev/null; then
    echo "[install-system-deps] not installed: ${missing[*]}" >&2
    echo "[install-system-deps] installing them needs root, and sudo is not installed; as root, run this script or:" >&2
    echo "  apt-get update && apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 1
  fi
  SUDO=(sudo)
fi
echo "[install-system-deps] installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt_opts=(-o DPkg::Lock::Timeout=600 -y --no-install-recommends)
"${SUDO[@]}" apt-get "${apt_opts[@]:0:2}" update -qq
# Debian's prometheus package starts a system-wide server on :9090 from its init
# script when it can. We run our own instance (hack/local-cluster.sh), so keep the
# package from starting a service during this install.
# The file must not outlive this install (it would keep every later package on the machine from starting
# its services), whatever ends the script: the EXIT trap removes it — only a file this script made, never
# one that was there before. A signal exits with its own status, so the EXIT trap runs on it too.
# RLSCHED_POLICY_RC_D: another path, for testing this script without root.
policy="${RLSCHED_POLICY_RC_D:-/usr/sbin/policy-rc.d}"
created_policy=false
remove_policy() {
  if ${created_policy}; then
    "${SUDO[@]}" rm -f "${policy}"
    created_policy=false
  fi
}
trap remove_policy EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
if [[ ! -e "${policy}" ]]; then
  created_policy=true  # before the write: a signal during it still removes what was written
  printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee "${policy}" >/dev/null
  "${SUDO[@]}" chmod +x "${policy}"
fi
rc=0
"${SUDO[@]}" apt-get "${apt_opts[@]}" install "${missing[@]}" || rc=$?
remove_policy
[[ ${rc} -eq 0 ]] || { echo "[install-system-deps] apt-get install failed (exit ${rc})" >&2; exit "${rc}"; }
echo "[install-system-deps] done"
