#!/usr/bin/env bash
# Release kube-rl-scheduler to an OCI registry: the image and the Helm chart, side by side.
#
# Usage: hack/release.sh REGISTRY [options]
#   REGISTRY           HOST[:PORT][/PATH] the image and the chart go to, e.g. ghcr.io/your-org,
#                      registry.example.com/team, 127.0.0.1:5000 (log in first: podman login HOST
#                      and helm registry login HOST, unless the registry is open)
# Options:
#   --image LOCAL      push this image already built here instead of building one
#                      (default: hack/build-image.sh --tag localhost/rl-scheduler:APPVERSION)
#   --base IMAGE       the base image for the build (hack/build-image.sh --base), e.g. python:3.11-slim
#   --plain-http       the registry speaks plain HTTP (a loopback or lab registry): podman
#                      --tls-verify=false, helm --plain-http
#   --insecure         HTTPS with a certificate nothing here trusts: podman --tls-verify=false,
#                      helm --insecure-skip-tls-verify
#   --chart-path PATH  where the chart goes under REGISTRY (default charts: oci://REGISTRY/charts/rl-scheduler)
#   --no-image         push the chart only        --no-chart   push the image only
#   --expect-version V fail unless the chart's appVersion is V (a CI run on tag vV passes it)
#   --force            push the image even if REGISTRY/rl-scheduler:APPVERSION exists already (by
#                      default that is refused, exit 2: nodes that pulled the old one keep it)
#   --dry-run          print what would run, run nothing
#
# What it does, in order: checks that Chart.yaml's appVersion equals pyproject.toml's version;
# refuses (exit 2) if the registry has REGISTRY/rl-scheduler:APPVERSION already, unless --force;
# builds the image (podman, hack/build-image.sh) unless --image; tags it REGISTRY/rl-scheduler:APPVERSION
# and pushes it; `helm package`s a copy of helm/rl-scheduler whose values.yaml has image.repository
# REGISTRY/rl-scheduler and image.digest the digest just pushed (with --no-image: the repository only,
# the tag stays the appVersion) and `helm push`es it to oci://REGISTRY/CHART_PATH; prints the
# `helm install` line that installs this release, with no image setting to add. The source chart keeps
# its local default (localhost/rl-scheduler). Tools: podman (and what hack/build-image.sh needs),
# helm >= 3.8, 3.13 with --plain-http (.tools/bin/helm from hack/build-tools.sh when present, else
# helm on PATH).
# tests/e2e/test_release_e2e.py runs it against a local registry and installs the printed line.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO_ROOT}"
export PYTHONSAFEPATH=1 # see hack/build-image.sh: the repository's operator/ folder

CHART_DIR=helm/rl-scheduler
IMAGE_NAME=rl-scheduler
NAMESPACE=rlsched-system # the namespace the README, docs/install.md and manifests/ use

log() { printf '[release %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }

registry="" local_image="" base="" chart_path=charts expect="" tls=verify
push_image=true push_chart=true dry_run=false force=false
while [[ $# -gt 0 ]]; do
  case "$1" in
    --image) local_image="${2:?--image needs a value}"; shift ;;
    --base) base="${2:?--base needs a value}"; shift ;;
    --plain-http) tls=plain ;;
    --insecure) tls=insecure ;;
    --chart-path) chart_path="${2:?--chart-path needs a value}"; shift ;;
    --no-image) push_image=false ;;
    --no-chart) push_chart=false ;;
    --expect-version) expect="${2:?--expect-version needs a value}"; shift ;;
    --dry-run) dry_run=true ;;
    --force) force=true ;;
    -h|--help) usage; exit 0 ;;
    -*) usage >&2; die "unknown option $1" ;;
    *) [[ -z "${registry}" ]] || die "one REGISTRY only (got ${registry} and $1)"; registry="$1" ;;
  esac
  shift
done
[[ -n "${registry}" ]] || { usage >&2; die "REGISTRY missing"; }
registry="${registry#oci://}"
registry="${registry%/}"
chart_path="${chart_path#/}"
chart_path="${chart_path%/}"
[[ "${registry}" =~ ^[a-z0-9]([a-z0-9.:-]*[a-z0-9])?(/[a-z0-9._-]+)*$ ]] \
  || die "REGISTRY '${registry}' is not HOST[:PORT][/PATH] in lower case (OCI references are lower case)"

# One field of Chart.yaml (top-level scalar, quotes dropped).
chart_field() {
  sed -nE "s/^$1:[[:space:]]*\"?([^\"#[:space:]]+)\"?.*$/\1/p" "${CHART_DIR}/Chart.yaml" | head -n 1
}
app_version="$(chart_field appVersion)"
chart_name="$(chart_field name)"
chart_version="$(chart_field version)"
py_version="$(sed -nE 's/^version[[:space:]]*=[[:space:]]*"([^"]+)".*$/\1/p' pyproject.toml | head -n 1)"
[[ -n "${app_version}" && -n "${chart_version}" && -n "${chart_name}" ]] || die "cannot read name/version/appVersion from ${CHART_DIR}/Chart.yaml"
[[ "${app_version}" == "${py_version}" ]] \
  || die "Chart.yaml appVersion ${app_version} != pyproject.toml version ${py_version}: bump both together"
[[ -z "${expect}" || "${expect#v}" == "${app_version}" ]] \
  || die "expected version ${expect#v}, but the chart's appVersion is ${app_version}"

remote_image="${registry}/${IMAGE_NAME}:${app_version}"
chart_ref="oci://${registry}/${chart_path}"
podman_tls=() helm_tls=()
case "${tls}" in
  plain) podman_tls=(--tls-verify=false) helm_tls=(--plain-http) ;;
  insecure) podman_tls=(--tls-verify=false) helm_tls=(--insecure-skip-tls-verify) ;;
esac

HELM=helm
[[ -x .tools/bin/helm ]] && HELM="${REPO_ROOT}/.tools/bin/helm"
PODMAN=(podman --cgroup-manager=cgroupfs) # as hack/build-image.sh: no systemd needed

# Runs "$@" (or, with --dry-run, prints it), its output on stderr: stdout is only the closing summary.
run() {
  if ${dry_run}; then { printf '+'; printf ' %q' "$@"; printf '\n'; } >&2; else "$@" >&2; fi
}
need() {
  ${dry_run} || command -v "$1" >/dev/null || [[ -x "$1" ]] || die "$1 missing ($2)"
}

digest="" # what podman push reports: the chart pins the image by it
work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT

# Is REGISTRY/rl-scheduler:APPVERSION there already? Pushing over it changes what the tag means, while
# nodes that pulled it (imagePullPolicy IfNotPresent) keep running the old image: refuse, exit 2, before
# building anything. A repository the registry does not know yet (404) has no tags.
tag_exists() {
  local repo="${registry}/${IMAGE_NAME}" tags
  if tags="$("${PODMAN[@]}" search --list-tags --limit 100000 "${podman_tls[@]}" "${repo}" 2>"${work}/search.err")"; then
    awk -v tag="${app_version}" 'NR > 1 && $2 "" == tag "" { found = 1 } END { exit !found }' <<<"${tags}"
  elif grep -qiE '(^|[^0-9])404([^0-9]|$)|name.unknown|not known to registry' "${work}/search.err"; then
    return 1
  else
    die "cannot list the tags of ${repo} to check for ${app_version}: $(tr -s '\n\t' '  ' <"${work}/search.err") (--force skips the check)"
  fi
}

if ${push_image}; then
  need podman "hack/install-system-deps.sh --containers"
  if ${force}; then
    log "--force: pushing ${remote_image} whether or not it exists"
  elif ${dry_run}; then
    run "${PODMAN[@]}" search --list-tags --limit 100000 "${podman_tls[@]}" "${registry}/${IMAGE_NAME}"
  elif tag_exists; then
    log "ERROR: ${remote_image} exists already (nodes that pulled it would keep it): bump the version, or --force to push over it"
    exit 2
  fi
  if [[ -z "${local_image}" ]]; then
    local_image="localhost/${IMAGE_NAME}:${app_version}"
    log "building ${local_image} (hack/build-image.sh)"
    build=(hack/build-image.sh --tag "${local_image}")
    [[ -z "${base}" ]] || build+=(--base "${base}")
    run "${build[@]}"
  elif ! ${dry_run}; then
    "${PODMAN[@]}" image exists "${local_image}" || die "no local image ${local_image} (podman images)"
  fi
  log "pushing ${local_image} as ${remote_image}"
  run "${PODMAN[@]}" tag "${local_image}" "${remote_image}"
  run "${PODMAN[@]}" push "${podman_tls[@]}" --digestfile "${work}/digest" "${remote_image}"
  if ! ${dry_run}; then
    digest="$(tr -d '[:space:]' <"${work}/digest")"
    [[ "${digest}" =~ ^sha256:[0-9a-f]{64}$ ]] || die "podman push reported no digest for ${remote_image} ('${digest}')"
    log "pushed ${remote_image}@${digest}"
  fi
fi

# The chart's values.yaml with the top-level image.repository (and image.digest, when one is given)
# replaced, comments kept; fails unless each line it must replace was there.
set_image_values() { # FILE REPOSITORY DIGEST
  awk -v repo="$2" -v digest="$3" '
    /^[^[:space:]#]/ { in_image = ($0 ~ /^image:/) }
    in_image && /^  repository:/ { print "  repository: \"" repo "\""; r++; next }
    in_image && /^  digest:/ && digest != "" { print "  digest: \"" digest "\""; d++; next }
    { print }
    END { exit !(r == 1 && (digest == "" || d == 1)) }
  ' "$1" >"$1.new" || die "cannot set image.repository/image.digest in $1"
  mv "$1.new" "$1"
}

if ${push_chart}; then
  need "${HELM}" "hack/build-tools.sh helm, or any helm >= 3.8 (3.13 with --plain-http)"
  # A copy of the chart that names this registry's image: installing it needs no --set image.*.
  packaged="${work}/chart/${chart_name}"
  mkdir -p "${work}/chart"
  cp -R "${CHART_DIR}" "${packaged}"
  set_image_values "${packaged}/values.yaml" "${registry}/${IMAGE_NAME}" "${digest}"
  if [[ -n "${digest}" ]]; then
    log "the chart's image: ${registry}/${IMAGE_NAME}@${digest}"
  elif ${push_image}; then
    log "the chart's image: ${registry}/${IMAGE_NAME}@<the digest podman push reports> (dry run)"
  else
    log "the chart's image: ${remote_image} (--no-image: no digest pinned)"
  fi
  log "packaging ${CHART_DIR} (chart ${chart_version}, appVersion ${app_version})"
  run "${HELM}" package "${packaged}" --destination "${work}"
  log "pushing the chart to ${chart_ref}"
  run "${HELM}" push "${helm_tls[@]}" "${work}/${chart_name}-${chart_version}.tgz" "${chart_ref}"
fi

# What a user runs next (README, "Installing on a cluster"). The last line of stdout is the install line.
install=(helm install rl-scheduler "${chart_ref}/${chart_name}" --version "${chart_version}"
  -n "${NAMESPACE}" --wait "${helm_tls[@]}")
done_word=Released
! ${dry_run} || done_word="Dry run: would release"
cat <<EOF

${done_word} ${chart_name} ${chart_version} (image ${remote_image}${digest:+@${digest}}) to ${registry}.
Install it (the kube-scheduler image must be within one minor version of your API server:
add --set scheduler.image.tag=vX.Y.Z unless it runs $(sed -nE 's/^    tag: "?(v[0-9.]+)"?.*$/\1/p' "${CHART_DIR}/values.yaml" | head -n 1)):

  kubectl create namespace ${NAMESPACE}
  kubectl label namespace ${NAMESPACE} pod-security.kubernetes.io/enforce=restricted
  $(printf '%q ' "${install[@]}" | sed 's/ $//')
EOF
