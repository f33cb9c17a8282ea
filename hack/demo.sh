#!/usr/bin/env bash
# The demo: kube-rl-scheduler on a real (local) Kubernetes control plane, in one command.
#
#   hack/demo.sh            install what is missing, bring everything up, run the workload, report
#   hack/demo.sh status     what runs
#   hack/demo.sh down       stop the extender, our kube-scheduler, the operator, the load exporter
#                           and the cluster (hack/local-cluster.sh down)
#
# `up` is idempotent: Debian packages (hack/install-system-deps.sh), the Python environment (.venv),
# the control-plane binaries (hack/build-tools.sh: ~15 min the first time on 2 cores, <1 s after),
# the cluster (hack/local-cluster.sh: etcd, kube-apiserver, controller-manager, kwok, the default
# kube-scheduler, Prometheus), then hack/rlstack.py: the per-node load exporter registered with
# Prometheus, `rlsched extender` serving the bundled model (the FGD heuristic when none is installed),
# `rlsched operator` publishing the SchedulingPolicy rlsched-demo/default, and a second kube-scheduler
# with our configuration (profile rl-scheduler, the extender on loopback, lease kube-system/rl-scheduler).
# Then hack/demo.py creates 8 kwok GPU nodes, waits (<= 90 s, RLSCHED_DEMO_LOAD_WAIT_S) until the extender
# sees their load through Prometheus (or says plainly that it does not), submits ~20 pods and prints
# where each went and the node load the extender had when it placed them.
# The cluster stays up; every process has a pid file under $RLSCHED_CLUSTER_DIR/run.
#
# Env: RLSCHED_CLUSTER_DIR (default .cache/cluster; a relative one is under the repo), PYTHON (default python3),
#      RLSCHED_DEMO_LOAD_WAIT_S.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The repository root holds a folder named `operator/` (mapped to rlsched.operator). `python -m X` and
# `python -c` put the current directory first on sys.path, where that folder would shadow the standard
# library's `operator` module before site-packages load; PYTHONSAFEPATH (Python 3.11+) stops that, here
# and in every process these scripts start.
export PYTHONSAFEPATH=1
cd "${REPO_ROOT}"
export RLSCHED_CLUSTER_DIR="${RLSCHED_CLUSTER_DIR:-${REPO_ROOT}/.cache/cluster}"
# Everything here runs in the repository root, so a relative state dir is under it; made absolute, the
# commands printed at the end work from any folder.
[[ "${RLSCHED_CLUSTER_DIR}" == /* ]] || RLSCHED_CLUSTER_DIR="${REPO_ROOT}/${RLSCHED_CLUSTER_DIR}"
VENV_PY="${REPO_ROOT}/.venv/bin/python"

log() { printf '[demo %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

down() {
  if [[ -x "${VENV_PY}" ]]; then
    "${VENV_PY}" hack/rlstack.py down || true
  fi
  hack/local-cluster.sh down
}

status() {
  hack/local-cluster.sh status || true
  if [[ -x "${VENV_PY}" ]]; then "${VENV_PY}" hack/rlstack.py status; fi
}

up() {
  log "system packages"
  hack/install-system-deps.sh

  log "python environment (.venv)"
  if [[ ! -x "${VENV_PY}" ]]; then
    "${PYTHON:-python3}" -m venv .venv
  fi
  if ! "${VENV_PY}" -c 'import rlsched.extender, rlsched.operator, kubernetes, aiohttp' 2>/dev/null; then
    # A venv made while ensurepip was missing (Debian without python3-venv) has bin/python but no pip.
    if ! "${VENV_PY}" -m pip --version >/dev/null 2>&1; then
      log ".venv has no pip (made without python3-venv?): making it again"
      "${PYTHON:-python3}" -m venv --clear .venv
    fi
    "${VENV_PY}" -m pip install --quiet --upgrade pip
    "${VENV_PY}" -m pip install --quiet -e .
  fi

  log "control-plane binaries (hack/build-tools.sh; the first build takes ~15 min on 2 cores)"
  hack/build-tools.sh

  log "cluster (${RLSCHED_CLUSTER_DIR})"
  hack/local-cluster.sh up >/dev/null

  log "extender, kube-scheduler (profile rl-scheduler), operator, load exporter"
  "${VENV_PY}" hack/rlstack.py up --operator rlsched-demo --load-exporter --exporter-selector rlsched.io/demo=1 \
    --explain-load

  log "workload"
  "${VENV_PY}" hack/demo.py

  # Pasteable from any folder: absolute paths, quoted for the shell (%q), the state dir when not the default.
  local prefix="" root
  root="$(printf '%q' "${REPO_ROOT}")"
  if [[ "${RLSCHED_CLUSTER_DIR}" != "${REPO_ROOT}/.cache/cluster" ]]; then
    prefix="RLSCHED_CLUSTER_DIR=$(printf '%q' "${RLSCHED_CLUSTER_DIR}") "
  fi
  cat <<EOF

The cluster stays up. Look around:
  eval "\$(${prefix}${root}/hack/local-cluster.sh env)"; kubectl get pods -n rlsched-demo -o wide; kubectl get spol -n rlsched-demo
  ${prefix}${root}/hack/demo.sh status   # processes, logs, the policy serving
Tear it all down:
  ${prefix}${root}/hack/demo.sh down
EOF
}

case "${1:-up}" in
  up) up ;;
  down) down ;;
  status) status ;;
  -h|--help|help) sed -n '2,22p' "${BASH_SOURCE[0]}" ;;
  *) echo "usage: $0 [up|status|down]" >&2; exit 2 ;;
esac
