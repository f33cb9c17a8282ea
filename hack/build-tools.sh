#!/usr/bin/env bash
# Builds the local control-plane tools from Go modules pinned in hack/tools/:
#   kube-apiserver kube-controller-manager kube-scheduler kubectl  (hack/tools/kubernetes)
#   etcd (hack/tools/etcd)   kwok (hack/tools/kwok)   helm (hack/tools/helm)
#   registry (hack/tools/distribution: the CNCF distribution OCI registry, for the release test)
# into a cache folder outside the repo, keyed by the pinned versions and a hash of
# the wrapper modules, and points the repo's git-ignored .tools/bin at it.
#
# Usage: hack/build-tools.sh [--print-bin-dir] [BINARY ...]     (default: all binaries)
# Env:
#   RLSCHED_TOOLS_CACHE  cache root (default: $HOME/.cache/rlsched/tools); binaries go
#                        to $RLSCHED_TOOLS_CACHE/<key>/bin
#   GOCACHE, GOMODCACHE  as usual for go; cache them in CI.
#   BUILD_PARALLELISM    go build -p (default 2)
# A second run with everything present does not invoke go at all: it checks that
# each binary exists and reports the expected version, and takes about a second.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS_DIR="${REPO_ROOT}/hack/tools"
# shellcheck source=tools/versions.env
source "${TOOLS_DIR}/versions.env"

# Bump when the build recipe (ldflags, tags) changes, to force a rebuild into a new key.
RECIPE_REV=1

log() { printf '[build-tools %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

ALL_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok helm registry)
KUBE_MAJOR="${KUBE_VERSION#v}"; KUBE_MAJOR="${KUBE_MAJOR%%.*}"
KUBE_MINOR="${KUBE_VERSION#v*.}"; KUBE_MINOR="${KUBE_MINOR%%.*}"

case "$(uname -m)" in
  x86_64) ARCH=amd64 ;;
  aarch64|arm64) ARCH=arm64 ;;
  *) ARCH="$(uname -m)" ;;
esac

cache_key() {
  local h
  h="$(cd "${TOOLS_DIR}" && cat versions.env ./*/go.mod ./*/go.sum ./*/main.go | { cat; echo "recipe=${RECIPE_REV}"; } \
        | sha256sum | cut -c1-10)"
  echo "k8s-${KUBE_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}_registry-${DISTRIBUTION_VERSION}_linux-${ARCH}_${h}"
}

CACHE_ROOT="${RLSCHED_TOOLS_CACHE:-${HOME}/.cache/rlsched/tools}"
KEY="$(cache_key)"
BIN_DIR="${CACHE_ROOT}/${KEY}/bin"

# Per binary: module dir (under hack/tools), Go package, version command, expected substring.
module_of() {
  case "$1" in
    kube-apiserver|kube-controller-manager|kube-scheduler|kubectl) echo kubernetes ;;
    etcd|kwok|helm) echo "$1" ;;
    registry) echo distribution ;;
    *) return 1 ;;
  esac
}
package_of() {
  case "$1" in
    kube-apiserver|kube-controller-manager|kube-scheduler|kubectl) echo "k8s.io/kubernetes/cmd/$1" ;;
    etcd) echo "rlsched.local/hack/tools/etcd" ;;
    kwok) echo "sigs.k8s.io/kwok/cmd/kwok" ;;
    helm) echo "helm.sh/helm/v3/cmd/helm" ;;
    registry) echo "rlsched.local/hack/tools/distribution" ;;
  esac
}
ldflags_of() {
  local kv
  case "$1" in
    kube-apiserver|kube-controller-manager|kube-scheduler|kubectl)
      for kv in "gitVersion=${KUBE_VERSION}" "gitMajor=${KUBE_MAJOR}" "gitMinor=${KUBE_MINOR}" "gitTreeState=clean" \
                "gitCommit=" ; do
        printf -- '-X k8s.io/component-base/version.%s -X k8s.io/client-go/pkg/version.%s ' "${kv}" "${kv}"
      done ;;
    etcd) printf -- '-X go.etcd.io/etcd/api/v3/version.GitSHA=%s ' "${ETCD_VERSION}" ;;
    registry) printf -- '-X github.com/distribution/distribution/v3/version.version=%s ' "${DISTRIBUTION_VERSION}" ;;
    kwok) printf -- '-X sigs.k8s.io/kwok/pkg/consts.Version=%s -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=%s ' \
            "${KWOK_VERSION#v}" "${KUBE_VERSION#v}" ;;
    helm)
      printf -- '-X helm.sh/helm/v3/internal/version.version=%s -X helm.sh/helm/v3/internal/version.gitTreeState=clean ' "${HELM_VERSION}"
      local p
      for p in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
        printf -- '-X %s.k8sVersionMajor=%s -X %s.k8sVersionMinor=%s ' "${p}" "${KUBE_MAJOR}" "${p}" "${KUBE_MINOR}"
      done ;;
  esac
  printf -- '-s -w'
}
# Prints the binary's own version output (stdout+stderr).
version_output() {
  local bin="${BIN_DIR}/$1"
  case "$1" in
    kube-apiserver|kube-controller-manager|kube-scheduler|etcd|kwok|registry) "${bin}" --version 2>&1 ;;
    kubectl) "${bin}" version --client 2>&1 ;;
    helm) HELM_CONFIG_HOME=/nonexistent "${bin}" version --short 2>&1 ;;  # no config read, no folder made
  esac
}
expected_version() {
  case "$1" in
    kube-apiserver|kube-controller-manager|kube-scheduler) echo "Kubernetes ${KUBE_VERSION}" ;;
    kubectl) echo "Client Version: ${KUBE_VERSION}" ;;
    etcd) echo "etcd Version: ${ETCD_VERSION#v}" ;;
    kwok) echo "${KWOK_VERSION}" ;;
    helm) echo "${HELM_VERSION}" ;;
    registry) echo "github.com/distribution/distribution/v3 ${DISTRIBUTION_VERSION}" ;;
  esac
}

is_current() {
  local b="$1"
  [[ -x "${BIN_DIR}/${b}" ]] || return 1
  local out
  out="$(version_output "${b}")" || return 1
  [[ "${out}" == *"$(expected_version "${b}")"* ]]
}

build_one() {
  local b="$1" mod pkg ldflags out start rc
  mod="${TOOLS_DIR}/$(module_of "${b}")"
  pkg="$(package_of "${b}")"
  ldflags="$(ldflags_of "${b}")"
  start=${SECONDS}

  log "${b}: fetching modules for ${pkg} (hack/tools/$(module_of "${b}"))"
  # stdout: packages that failed to load; stderr: "go: downloading ..." and go's own errors.
  local errf
  errf="$(mktemp)"
  if ! out="$(cd "${mod}" && go list -deps -f '{{if .Error}}{{.ImportPath}}: {{.Error}}{{end}}' "${pkg}" 2>"${errf}")" \
      || [[ -n "${out}" ]]; then
    { grep -v '^go: downloading ' "${errf}"; printf '%s\n' "${out}"; } | tail -n 30 >&2
    rm -f "${errf}"
    die "${b}: could not fetch/resolve the modules of ${pkg} in hack/tools/$(module_of "${b}") (go error above)"
  fi

  log "${b}: building ${pkg} (downloaded $(grep -c '^go: downloading ' "${errf}" || true) modules in $((SECONDS - start))s)"
  rm -f "${errf}"
  rm -f "${BIN_DIR}/.${b}.tmp"
  rc=0
  (cd "${mod}" && CGO_ENABLED=0 go build -trimpath -p "${BUILD_PARALLELISM:-2}" -ldflags "${ldflags}" \
      -o "${BIN_DIR}/.${b}.tmp" "${pkg}") || rc=$?
  if [[ ${rc} -ne 0 ]]; then
    rm -f "${BIN_DIR}/.${b}.tmp"
    die "${b}: go build ${pkg} in hack/tools/$(module_of "${b}") failed (exit ${rc}; go error above)"
  fi
  mv -f "${BIN_DIR}/.${b}.tmp" "${BIN_DIR}/${b}"
  is_current "${b}" || die "${b}: built, but '$(version_output "${b}" | head -n 3)' does not contain '$(expected_version "${b}")'"
  log "${b}: built in $((SECONDS - start))s ($(du -h "${BIN_DIR}/${b}" | cut -f1))"
}

link_repo() {
  mkdir -p "${REPO_ROOT}/.tools"
  ln -sfn "${BIN_DIR}" "${REPO_ROOT}/.tools/bin"
}

main() {
  local print_bin_dir=false targets=() b
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --print-bin-dir) print_bin_dir=true ;;
      -h|--help) sed -n '2,16p' "${BASH_SOURCE[0]}"; exit 0 ;;
      -*) die "unknown flag $1" ;;
      *) module_of "$1" >/dev/null || die "unknown binary '$1' (known: ${ALL_BINARIES[*]})"; targets+=("$1") ;;
    esac
    shift
  done
  [[ ${#targets[@]} -gt 0 ]] || targets=("${ALL_BINARIES[@]}")

  local total_start=${SECONDS} missing=()
  mkdir -p "${BIN_DIR}"
  for b in "${targets[@]}"; do
    if is_current "${b}"; then
      log "${b}: up to date ($(expected_version "${b}"))"
    else
      missing+=("${b}")
    fi
  done

  if [[ ${#missing[@]} -gt 0 ]]; then
    command -v go >/dev/null || die "go is not on PATH (need Go >= 1.26 to build ${missing[*]})"
    # The tools' go.mod files say go 1.26.0, and GOTOOLCHAIN=local (below) downloads no newer toolchain.
    # GOTOOLCHAIN=local: the Go on PATH itself, never a toolchain `go` would download. A development
    # build ("devel go1.27-…") is taken at its version; a 1.26 pre-release is older than 1.26.0.
    gover="$(GOTOOLCHAIN=local go env GOVERSION 2>/dev/null || true)"; gover="${gover#devel }"; gover="${gover#go}"
    go_major="${gover%%.*}"; go_minor="${gover#*.}"; go_minor="${go_minor%%[!0-9]*}"
    if [[ ! "${go_major}" =~ ^[0-9]+$ || ! "${go_minor}" =~ ^[0-9]+$ ]] \
      || (( go_major < 1 || (go_major == 1 && go_minor < 26) )) || [[ "${gover}" =~ ^1\.26(rc|beta) ]]; then
      die "Go ${gover:-of unknown version} is too old to build ${missing[*]}: need Go >= 1.26 (https://go.dev/dl/)"
    fi
    export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false"
    # One build at a time per cache root: a second caller waits, then finds the binaries present.
    exec 9>"${CACHE_ROOT}/.build.lock"
    if ! flock -n 9; then
      log "another build-tools.sh holds ${CACHE_ROOT}/.build.lock; waiting"
      flock 9
    fi
    log "building ${missing[*]} into ${BIN_DIR} with $(go version | cut -d' ' -f3), -p ${BUILD_PARALLELISM:-2}"
    for b in "${missing[@]}"; do
      if is_current "${b}"; then log "${b}: built meanwhile by another caller"; continue; fi
      build_one "${b}"
    done
  fi

  link_repo
  log "done in $((SECONDS - total_start))s; ${REPO_ROOT}/.tools/bin -> ${BIN_DIR}"
  if ${print_bin_dir}; then echo "${BIN_DIR}"; fi
}

main "$@"
