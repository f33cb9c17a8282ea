#!/usr/bin/env bash
# The end-to-end tests against a kind cluster with the Helm chart installed — for users with
# Docker (or podman). The project's CI has no container engine that can run kind, so CI has never
# run this script: it runs the same tests against the local control plane instead
# (hack/test.sh, docs/e2e.md). It passes shellcheck.
#
# Steps: kind cluster (Kubernetes v1.37.2 node image) → build the rlsched image from the Dockerfile
# → load it into the kind nodes → kwok's in-cluster controller (fake GPU nodes; it manages nodes
# annotated kwok.x-k8s.io/node=fake, as the tests create them) → helm install helm/rl-scheduler →
# pytest tests/e2e with RLSCHED_E2E_KUBECONFIG: the tests marked `kind` run against the installed
# scheduler (placement, card annotations, no oversubscription, unschedulable reasons, the default
# scheduler untouched); the ones that need local processes (kill -9 of the extender, Prometheus
# load, the operator's local runs) are skipped with the reason.
#
# Usage: hack/kind-e2e.sh [--keep] [--no-build] [PYTEST ARGS...]
#   --keep       leave the kind cluster up (default: delete it at the end)
#   --no-build   use an image already built and tagged $IMAGE
# Env:
#   KIND_CLUSTER_NAME   (default rlsched-e2e)
#   KIND_NODE_IMAGE     (default kindest/node:v1.37.2; pick one your kind release publishes)
#   IMAGE               rlsched image (default localhost/rl-scheduler:kind-e2e)
#   CONTAINER_ENGINE    docker (default) or podman (then KIND_EXPERIMENTAL_PROVIDER=podman is set)
#   RELEASE_NAMESPACE   (default rlsched-system)
#   PYTHON              interpreter for .venv when it must be created (default python3)
# Needs: kind, helm, kubectl, docker or podman, network access (images, kwok manifests).
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The repository root holds a folder named `operator/` (mapped to rlsched.operator). `python -m X` and
# `python -c` put the current directory first on sys.path, where that folder would shadow the standard
# library's `operator` module before site-packages load; PYTHONSAFEPATH (Python 3.11+) stops that, here
# and in every process these scripts start.
export PYTHONSAFEPATH=1
cd "${REPO_ROOT}"
# shellcheck source=tools/versions.env
source hack/tools/versions.env

CLUSTER="${KIND_CLUSTER_NAME:-rlsched-e2e}"
NODE_IMAGE="${KIND_NODE_IMAGE:-kindest/node:${KUBE_VERSION}}"
IMAGE="${IMAGE:-localhost/rl-scheduler:kind-e2e}"
ENGINE="${CONTAINER_ENGINE:-docker}"
NAMESPACE="${RELEASE_NAMESPACE:-rlsched-system}"
KEEP=false
BUILD=true
PYTEST_ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --keep) KEEP=true ;;
    --no-build) BUILD=false ;;
    *) PYTEST_ARGS+=("$1") ;;
  esac
  shift
done

log() { printf '[kind-e2e %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

for tool in kind helm kubectl "${ENGINE}"; do
  command -v "${tool}" >/dev/null || die "${tool} not found in PATH"
done
if [[ "${ENGINE}" == podman ]]; then
  export KIND_EXPERIMENTAL_PROVIDER=podman
fi

# The Python environment first: a failure here costs seconds, not the minutes of a kind cluster. A .venv
# made by hack/demo.sh holds the package without the dev extra (no pytest): the extra is installed then.
log "python environment (.venv)"
if [[ ! -x .venv/bin/python ]]; then
  "${PYTHON:-python3}" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
fi
if ! .venv/bin/python -c 'import rlsched, pytest, pytest_asyncio, pytest_timeout, pytest_aiohttp, kubernetes' 2>/dev/null; then
  .venv/bin/python -m pip install --quiet -e '.[dev]'
fi

WORK="$(mktemp -d)"
KUBECONFIG_FILE="${WORK}/kubeconfig"
cleanup() {
  local rc=$?
  rm -f "${WORK}/image.tar"  # the saved image (podman): hundreds of MB
  if ! ${KEEP}; then
    log "deleting kind cluster ${CLUSTER}"
    kind delete cluster --name "${CLUSTER}" >/dev/null 2>&1 || true
    rm -rf "${WORK}"
  else
    log "kept: kind cluster ${CLUSTER} (kubeconfig ${KUBECONFIG_FILE})"
  fi
  exit "${rc}"
}
trap cleanup EXIT

log "kind cluster ${CLUSTER} (${NODE_IMAGE})"
if ! kind get clusters 2>/dev/null | grep -qx "${CLUSTER}"; then
  cat >"${WORK}/kind.yaml" <<EOF
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
- role: control-plane
  image: ${NODE_IMAGE}
EOF
  kind create cluster --name "${CLUSTER}" --config "${WORK}/kind.yaml" --wait 180s
fi
kind get kubeconfig --name "${CLUSTER}" >"${KUBECONFIG_FILE}"
export KUBECONFIG="${KUBECONFIG_FILE}"

if ${BUILD}; then
  log "building ${IMAGE} from the Dockerfile with ${ENGINE}"
  "${ENGINE}" build -t "${IMAGE}" -f Dockerfile .
fi
log "loading ${IMAGE} into the kind nodes"
if [[ "${ENGINE}" == podman ]]; then
  "${ENGINE}" save -o "${WORK}/image.tar" "${IMAGE}"
  kind load image-archive "${WORK}/image.tar" --name "${CLUSTER}"
else
  kind load docker-image "${IMAGE}" --name "${CLUSTER}"
fi

log "kwok ${KWOK_VERSION} controller (fake nodes)"
KWOK_URL="https://github.com/kubernetes-sigs/kwok/releases/download/${KWOK_VERSION}"
kubectl apply -f "${KWOK_URL}/kwok.yaml"
kubectl apply -f "${KWOK_URL}/stage-fast.yaml"
kubectl -n kube-system rollout status deployment/kwok-controller --timeout=180s

log "helm install helm/rl-scheduler (namespace ${NAMESPACE})"
helm upgrade --install rl-scheduler helm/rl-scheduler --namespace "${NAMESPACE}" --create-namespace \
  --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never \
  --wait --timeout 5m

log "pytest tests/e2e -m kind"
RLSCHED_E2E_KUBECONFIG="${KUBECONFIG_FILE}" RLSCHED_E2E_SCHEDULER_NAME=rl-scheduler \
  .venv/bin/python -m pytest tests/e2e -m kind -p no:cacheprovider "${PYTEST_ARGS[@]}"
