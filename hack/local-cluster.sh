#!/usr/bin/env bash
# A real Kubernetes control plane on loopback, without Docker or kubelets:
# etcd, kube-apiserver (TLS, Node+RBAC), kube-controller-manager, kwok (fake nodes
# and the pods bound to them), optionally kube-scheduler and Prometheus.
# Binaries come from hack/build-tools.sh (.tools/bin); prometheus from Debian
# (hack/install-system-deps.sh). See docs/local-control-plane.md.
#
# Usage:
#   hack/local-cluster.sh up [--scheduler-config FILE | --no-scheduler] [--no-prometheus]
#                            [--prometheus-targets FILE] [--fake-nodes N] [--kwok-config FILE]...
#   hack/local-cluster.sh scheduler start [--scheduler-config FILE] | scheduler stop
#   hack/local-cluster.sh down [--keep]   # also stops what hack/rlstack.py started (pid files in run/)
#   hack/local-cluster.sh status
#   hack/local-cluster.sh env            # eval "$(hack/local-cluster.sh env)"
#
# Env (all optional):
#   RLSCHED_CLUSTER_DIR     state dir (default: <repo>/.cache/cluster)
#   RLSCHED_TOOLS_BIN       binaries (default: <repo>/.tools/bin)
#   RLSCHED_ETCD_PORT, RLSCHED_ETCD_PEER_PORT, RLSCHED_APISERVER_PORT, RLSCHED_KCM_PORT,
#   RLSCHED_SCHEDULER_PORT, RLSCHED_KWOK_PORT, RLSCHED_PROMETHEUS_PORT
#                           fixed ports (up fails if one is taken or two are equal); unset: the default
#                           (23790 23800 16443 20257 20259 20247 19090) when free, else any
#                           free port. The ports in use are in $RLSCHED_CLUSTER_DIR/ports.env.
#   RLSCHED_UP_TIMEOUT      seconds to wait for each component (default 120)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The repository root holds a folder named `operator/` (mapped to rlsched.operator). `python -m X` and
# `python -c` put the current directory first on sys.path, where that folder would shadow the standard
# library's `operator` module before site-packages load; PYTHONSAFEPATH (Python 3.11+) stops that, here
# and in every process these scripts start.
export PYTHONSAFEPATH=1
STATE="${RLSCHED_CLUSTER_DIR:-${REPO_ROOT}/.cache/cluster}"
BIN="${RLSCHED_TOOLS_BIN:-${REPO_ROOT}/.tools/bin}"
TIMEOUT="${RLSCHED_UP_TIMEOUT:-120}"
PKI="${STATE}/pki"
RUN="${STATE}/run"
LOGS="${STATE}/logs"
KCFG="${STATE}/kubeconfigs"
ADMIN_KUBECONFIG="${STATE}/kubeconfig"
SERVICE_CIDR="10.96.0.0/16"
SERVICE_FIRST_IP="10.96.0.1"
POD_CIDR="10.244.0.1/16"
KWOK_STAGES="${REPO_ROOT}/hack/kwok/stages.yaml"
# Small helpers below need Python with PyYAML: the project's venv when there is one (hack/test.sh and
# hack/demo.sh make it), else python3 from PATH.
PY="${REPO_ROOT}/.venv/bin/python"
[[ -x "${PY}" ]] || PY=python3
KWOK_EXTRA_CONFIGS=()  # up --kwok-config FILE: more kwok config files (Stages) after stages.yaml
# Start order; down stops in reverse.
COMPONENTS=(etcd kube-apiserver kube-controller-manager kwok kube-scheduler prometheus)

log() { printf '[local-cluster %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ---------------------------------------------------------------- ports
declare -A PORT_VAR=(
  [etcd]=ETCD_PORT [etcd-peer]=ETCD_PEER_PORT [kube-apiserver]=APISERVER_PORT
  [kube-controller-manager]=KCM_PORT [kube-scheduler]=SCHEDULER_PORT [kwok]=KWOK_PORT
  [prometheus]=PROMETHEUS_PORT
)
declare -A PORT_DEFAULT=(
  [ETCD_PORT]=23790 [ETCD_PEER_PORT]=23800 [APISERVER_PORT]=16443 [KCM_PORT]=20257
  [SCHEDULER_PORT]=20259 [KWOK_PORT]=20247 [PROMETHEUS_PORT]=19090
)

port_listening() { [[ -n "$(ss -ltnH "sport = :$1" 2>/dev/null)" ]]; }

free_port() {
  "${PY}" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# Chooses every port (env override > kept ports.env > default if free > any free port)
# and writes ports.env. No two components get the same port: the env overrides are placed first (two
# equal ones fail), then a kept or default port that one of them (or an earlier component) already has
# counts as taken, like a port in use, and moves to a free one.
choose_ports() {
  local var env_var value
  declare -A kept_ports=() owner=()
  if [[ -f "${STATE}/ports.env" ]]; then
    while IFS='=' read -r var value; do kept_ports[${var}]="${value}"; done <"${STATE}/ports.env"
  fi
  local vars
  mapfile -t vars < <(printf '%s\n' "${!PORT_DEFAULT[@]}" | sort)
  for var in "${vars[@]}"; do
    env_var="RLSCHED_${var}"
    [[ -n "${!env_var:-}" ]] || continue
    value="${!env_var}"
    if [[ -n "${owner[${value}]:-}" ]]; then
      die "${env_var}=${value}, but RLSCHED_${owner[${value}]} is ${value} too: give each component its own port"
    fi
    if port_listening "${value}"; then
      die "${env_var}=${value}, but that port is in use: $(ss -ltnpH "sport = :${value}")"
    fi
    owner[${value}]="${var}"
  done
  for var in "${vars[@]}"; do
    env_var="RLSCHED_${var}"
    [[ -z "${!env_var:-}" ]] || continue
    value="${kept_ports[${var}]:-${PORT_DEFAULT[${var}]}}"
    if [[ -n "${owner[${value}]:-}" ]]; then
      log "port ${value} for ${var} is ${owner[${value}]}'s; using a free one"
      value="$(unowned_free_port)"
    elif port_listening "${value}"; then
      value="$(unowned_free_port)"
      log "default port for ${var} is taken; using ${value}"
    fi
    owner[${value}]="${var}"
  done
  local lines=""
  for value in "${!owner[@]}"; do
    var="${owner[${value}]}"
    printf -v "${var}" '%s' "${value}"
    lines+="${var}=${value}"$'\n'
  done
  printf '%s' "${lines}" | sort >"${STATE}/ports.env"
}

# A free port that no component has yet (reads choose_ports' `owner`).
unowned_free_port() {
  local port
  port="$(free_port)"
  while [[ -n "${owner[${port}]:-}" ]]; do port="$(free_port)"; done
  echo "${port}"
}

load_ports() {
  [[ -f "${STATE}/ports.env" ]] || return 1
  local var value
  while IFS='=' read -r var value; do printf -v "${var}" '%s' "${value}"; done <"${STATE}/ports.env"
}

port_of() { local v="${PORT_VAR[$1]}"; echo "${!v:-?}"; }

# ---------------------------------------------------------------- pki
gen_key() { [[ -f "$1" ]] || openssl genrsa -out "$1" 2048 2>/dev/null; }

# gen_cert NAME SUBJECT EXT   -> $PKI/NAME.{key,crt}, signed by the CA
gen_cert() {
  local name="$1" subj="$2" ext="$3"
  [[ -f "${PKI}/${name}.crt" ]] && return 0
  gen_key "${PKI}/${name}.key"
  openssl req -new -key "${PKI}/${name}.key" -subj "${subj}" -out "${PKI}/${name}.csr" 2>/dev/null
  printf '%b\n' "${ext}" >"${PKI}/${name}.ext"
  openssl x509 -req -in "${PKI}/${name}.csr" -CA "${PKI}/ca.crt" -CAkey "${PKI}/ca.key" -CAcreateserial \
    -days 365 -sha256 -extfile "${PKI}/${name}.ext" -out "${PKI}/${name}.crt" 2>/dev/null \
    || die "openssl could not sign ${name}"
  rm -f "${PKI}/${name}.csr" "${PKI}/${name}.ext"
}

gen_pki() {
  command -v openssl >/dev/null || die "openssl not found (hack/install-system-deps.sh)"
  mkdir -p "${PKI}"
  chmod 700 "${PKI}"
  if [[ ! -f "${PKI}/ca.crt" ]]; then
    gen_key "${PKI}/ca.key"
    openssl req -x509 -new -key "${PKI}/ca.key" -subj "/CN=rlsched-local-ca" -days 3650 -sha256 \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
      -out "${PKI}/ca.crt" 2>/dev/null || die "openssl could not create the CA"
  fi
  local client="basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth"
  local server="basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth"
  gen_cert apiserver "/CN=kube-apiserver" \
    "${server}\nsubjectAltName=IP:127.0.0.1,IP:${SERVICE_FIRST_IP},DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  gen_cert admin "/O=system:masters/CN=rlsched-admin" "${client}"
  # Serving certs for the controller-manager and scheduler, so their /healthz verifies with ca.crt.
  gen_cert kube-controller-manager-serving "/CN=kube-controller-manager" "${server}\nsubjectAltName=IP:127.0.0.1,DNS:localhost"
  gen_cert kube-scheduler-serving "/CN=kube-scheduler" "${server}\nsubjectAltName=IP:127.0.0.1,DNS:localhost"
  gen_cert kube-controller-manager "/CN=system:kube-controller-manager" "${client}"
  gen_cert kube-scheduler "/CN=system:kube-scheduler" "${client}"
  gen_cert kwok "/O=system:masters/CN=kwok-controller" "${client}"
  # Front proxy (requestheader) CA and client: lets aggregated API servers (metrics-server, ...)
  # and the components' delegated authentication trust the apiserver's proxied requests.
  if [[ ! -f "${PKI}/front-proxy-ca.crt" ]]; then
    gen_key "${PKI}/front-proxy-ca.key"
    openssl req -x509 -new -key "${PKI}/front-proxy-ca.key" -subj "/CN=rlsched-local-front-proxy-ca" -days 3650 \
      -sha256 -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
      -out "${PKI}/front-proxy-ca.crt" 2>/dev/null || die "openssl could not create the front-proxy CA"
  fi
  if [[ ! -f "${PKI}/front-proxy-client.crt" ]]; then
    gen_key "${PKI}/front-proxy-client.key"
    openssl req -new -key "${PKI}/front-proxy-client.key" -subj "/CN=front-proxy-client" 2>/dev/null \
      | openssl x509 -req -CA "${PKI}/front-proxy-ca.crt" -CAkey "${PKI}/front-proxy-ca.key" -CAcreateserial \
          -days 365 -sha256 -extfile <(printf '%b\n' "${client}") -out "${PKI}/front-proxy-client.crt" 2>/dev/null \
      || die "openssl could not sign front-proxy-client"
  fi
  if [[ ! -f "${PKI}/sa.key" ]]; then
    gen_key "${PKI}/sa.key"
    openssl rsa -in "${PKI}/sa.key" -pubout -out "${PKI}/sa.pub" 2>/dev/null
  fi
}

# write_kubeconfig FILE CERTNAME
write_kubeconfig() {
  local file="$1" name="$2" old_umask
  # It holds a private key: created 0600 (umask 077), never readable by others even for a moment, and
  # moved into place whole (a kubeconfig left from an earlier up keeps no wider mode).
  old_umask="$(umask)"
  umask 077
  rm -f "${file}.tmp"
  cat >"${file}.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: rlsched-local
  cluster:
    server: https://127.0.0.1:${APISERVER_PORT}
    certificate-authority-data: $(base64 -w0 <"${PKI}/ca.crt")
users:
- name: ${name}
  user:
    client-certificate-data: $(base64 -w0 <"${PKI}/${name}.crt")
    client-key-data: $(base64 -w0 <"${PKI}/${name}.key")
contexts:
- name: rlsched-local
  context:
    cluster: rlsched-local
    user: ${name}
current-context: rlsched-local
EOF
  umask "${old_umask}"
  chmod 600 "${file}.tmp"
  mv -f "${file}.tmp" "${file}"
}

write_kubeconfigs() {
  mkdir -p "${KCFG}"
  write_kubeconfig "${ADMIN_KUBECONFIG}" admin
  local n
  for n in kube-controller-manager kube-scheduler kwok; do write_kubeconfig "${KCFG}/${n}.kubeconfig" "${n}"; done
}

# ---------------------------------------------------------------- processes
pid_of() { [[ -f "${RUN}/$1.pid" ]] && cat "${RUN}/$1.pid"; }

# proc_stat PID: the fields of /proc/PID/stat after the command name (state first; field 22, the start
# time, is the 20th). The name is cut at the last ")": it may hold spaces and parentheses itself.
proc_stat() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  [[ "${stat}" == *")"* ]] || return 1
  printf '%s\n' "${stat##*)}"
}

# start_time PID: when PID started (clock ticks after boot). A pid is reused once its process is gone;
# (pid, start time) is not, so run/NAME.start records it beside run/NAME.pid.
start_time() {
  local fields
  read -r -a fields <<<"$(proc_stat "$1")"
  [[ "${fields[19]:-}" =~ ^[0-9]+$ ]] || return 1
  echo "${fields[19]}"
}

argv0_of() { tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null | head -n 1; }

# pid_verdict NAME: what the component's recorded pid is now (as hack/stacklib/common.py's PidRecord):
# ours (runs, same start time and executable), gone, reused (another process has the pid), or
# unverified (runs the recorded executable, but the pid file has no start time: an older version of this
# script wrote it, and it may be another process of the same program that got the pid).
pid_verdict() {
  local pid started fields
  pid="$(pid_of "$1" 2>/dev/null)" || pid=""
  if [[ ! "${pid}" =~ ^[0-9]+$ ]]; then echo gone; return; fi
  read -r -a fields <<<"$(proc_stat "${pid}")"
  if [[ -z "${fields[0]:-}" || "${fields[0]}" == Z ]]; then echo gone; return; fi
  if [[ "$(argv0_of "${pid}")" != "$(cat "${RUN}/$1.exe" 2>/dev/null)" ]]; then echo reused; return; fi
  started="$(cat "${RUN}/$1.start" 2>/dev/null)" || started=""
  if [[ -z "${started}" ]]; then echo unverified; return; fi
  if [[ "${fields[19]:-}" == "${started}" ]]; then echo ours; else echo reused; fi
}

# True when the component's recorded pid is alive and still the process we started: same start time,
# same binary. A pid file without a start time never counts (see pid_verdict).
alive() { [[ "$(pid_verdict "$1")" == ours ]]; }

# What stop says about a pid it leaves alone.
say_not_stopped() {
  local name="$1" pid
  pid="$(pid_of "${name}" 2>/dev/null)" || return 0
  case "$(pid_verdict "${name}")" in
    unverified)
      log "WARNING: ${name}: NOT stopping pid ${pid}: it runs $(cat "${RUN}/${name}.exe"), but ${RUN}/${name}.pid has no" \
        "start time (an older version wrote it), so it may be another process that got the pid. If it is ours" \
        "(ps -o pid,lstart,args -p ${pid}), stop it yourself: kill -- -${pid}" ;;
    reused) log "${name}: pid ${pid} is another process now (ours has ended): not signalled" ;;
  esac
}

# start NAME CMD... : runs CMD in its own session/process group, output to logs/NAME.log
start() {
  local name="$1"; shift
  mkdir -p "${RUN}" "${LOGS}"
  printf '%q ' "$@" >"${RUN}/${name}.cmd"
  echo "$1" >"${RUN}/${name}.exe"
  setsid "$@" >>"${LOGS}/${name}.log" 2>&1 </dev/null &
  local pid=$! i
  # The start time is the fork's, the same before and after setsid's exec. (Empty if it is gone already:
  # then alive() is false, as it should be.)
  start_time "${pid}" >"${RUN}/${name}.start" || true
  echo "${pid}" >"${RUN}/${name}.pid"
  # Until setsid has exec'd the binary, /proc/PID/cmdline still names bash or setsid, and alive()
  # would call the component dead; wait out that window (or the process's early death).
  for ((i = 0; i < 100; i++)); do
    [[ "$(argv0_of "${pid}")" == "$1" ]] && break
    running "${pid}" "$(cat "${RUN}/${name}.start")" || break
    sleep 0.02
  done
  log "${name}: started pid ${pid} (port $(port_of "${name}"), log ${LOGS}/${name}.log)"
}

# running PID START: true while PID exists, is not a zombie (our children are reparented to PID 1 once
# `up` exits, and it may reap them late) and started at START (so not a later process with the pid).
running() {
  local fields
  read -r -a fields <<<"$(proc_stat "$1")"
  [[ -n "${fields[0]:-}" && "${fields[0]}" != Z && "${fields[19]:-}" == "$2" ]]
}

# stop NAME: only a pid that is still ours (alive); any other pid file is removed without a signal.
stop() {
  local name="$1" pid started i
  if ! alive "${name}"; then
    say_not_stopped "${name}"
    rm -f "${RUN}/${name}".{pid,start,cmd,exe}
    return 0
  fi
  pid="$(pid_of "${name}")"
  started="$(cat "${RUN}/${name}.start")"
  # setsid made the process a group leader; signal the whole group.
  kill -TERM -- "-${pid}" 2>/dev/null || kill -TERM "${pid}" 2>/dev/null || true
  for ((i = 0; i < 150; i++)); do
    running "${pid}" "${started}" || break
    sleep 0.1
  done
  if running "${pid}" "${started}"; then
    log "${name}: pid ${pid} ignored SIGTERM for 15s; SIGKILL"
    kill -KILL -- "-${pid}" 2>/dev/null || kill -KILL "${pid}" 2>/dev/null || true
    sleep 0.2
  fi
  log "${name}: stopped (pid ${pid})"
  rm -f "${RUN}/${name}".{pid,start,cmd,exe}
}

fail_component() {
  local name="$1" why="$2"
  log "ERROR: ${name}: ${why}"
  if [[ -f "${LOGS}/${name}.log" ]]; then
    log "last 40 lines of ${LOGS}/${name}.log:"
    tail -n 40 "${LOGS}/${name}.log" >&2
  fi
  exit 1
}

# wait_for NAME DESCRIPTION CMD... : polls CMD until it succeeds, the process dies, or timeout.
wait_for() {
  local name="$1" what="$2" start=${SECONDS}; shift 2
  until "$@" >/dev/null 2>&1; do
    alive "${name}" || fail_component "${name}" "exited while waiting for ${what}"
    ((SECONDS - start < TIMEOUT)) || fail_component "${name}" "not ${what} after ${TIMEOUT}s"
    sleep 0.5
  done
  log "${name}: ${what} after $((SECONDS - start))s"
}

https_ok() {
  curl -sf --max-time 3 --cacert "${PKI}/ca.crt" --cert "${PKI}/admin.crt" --key "${PKI}/admin.key" "$1" | grep -qx ok
}
# --request-timeout: without it one request that never gets an answer (a wedged API server) blocks for
# ever. It bounds each request, not the command: an apply of many objects makes one request per object.
kubectl_() { "${BIN}/kubectl" --kubeconfig "${ADMIN_KUBECONFIG}" --request-timeout=10s "$@"; }
# kubectl_ for one poll of a wait, also bounded as a whole: kubectl retries discovery (5 requests of 10 s,
# 50 s, against a server that never answers), and a wait must not outlast RLSCHED_UP_TIMEOUT by that much.
# A poll cut short just counts as "not yet".
KUBECTL_POLL_S=15
kubectl_poll() {
  # --foreground: kubectl stays in the script's process group, so Ctrl-C reaches it at once
  timeout --foreground "${KUBECTL_POLL_S}" "${BIN}/kubectl" --kubeconfig "${ADMIN_KUBECONFIG}" --request-timeout=10s "$@"
}

# ---------------------------------------------------------------- components
start_etcd() {
  mkdir -p "${STATE}/etcd-data"
  chmod 700 "${STATE}/etcd-data"
  start etcd "${BIN}/etcd" --name rlsched --data-dir "${STATE}/etcd-data" \
    --listen-client-urls "http://127.0.0.1:${ETCD_PORT}" --advertise-client-urls "http://127.0.0.1:${ETCD_PORT}" \
    --listen-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT}" --initial-advertise-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT}" \
    --initial-cluster "rlsched=http://127.0.0.1:${ETCD_PEER_PORT}" --initial-cluster-state new \
    --unsafe-no-fsync --quota-backend-bytes 4294967296 --log-level warn
  wait_for etcd healthy bash -c "curl -sf --max-time 3 http://127.0.0.1:${ETCD_PORT}/health | grep -q '\"health\":\"true\"'"
}

start_apiserver() {
  start kube-apiserver "${BIN}/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:${ETCD_PORT}" \
    --bind-address 127.0.0.1 --secure-port "${APISERVER_PORT}" --advertise-address 127.0.0.1 \
    --endpoint-reconciler-type none \
    --tls-cert-file "${PKI}/apiserver.crt" --tls-private-key-file "${PKI}/apiserver.key" \
    --client-ca-file "${PKI}/ca.crt" \
    --requestheader-client-ca-file "${PKI}/front-proxy-ca.crt" --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file "${PKI}/front-proxy-client.crt" --proxy-client-key-file "${PKI}/front-proxy-client.key" \
    --authorization-mode Node,RBAC \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "${PKI}/sa.pub" --service-account-signing-key-file "${PKI}/sa.key" \
    --service-cluster-ip-range "${SERVICE_CIDR}" --allow-privileged=true \
    --profiling=false
  wait_for kube-apiserver "ready (/readyz)" https_ok "https://127.0.0.1:${APISERVER_PORT}/readyz"
}

# --controllers '*': the on-by-default set. Since 1.3x kube-controller-manager has no cloud
# controllers left to disable (service-lb, node-route, cloud-node-lifecycle live in the
# cloud-controller-manager); node-ipam-controller idles without --allocate-node-cidrs.
start_controller_manager() {
  local kc="${KCFG}/kube-controller-manager.kubeconfig"
  start kube-controller-manager "${BIN}/kube-controller-manager" \
    --kubeconfig "${kc}" --authentication-kubeconfig "${kc}" --authorization-kubeconfig "${kc}" \
    --bind-address 127.0.0.1 --secure-port "${KCM_PORT}" --leader-elect=false \
    --tls-cert-file "${PKI}/kube-controller-manager-serving.crt" \
    --tls-private-key-file "${PKI}/kube-controller-manager-serving.key" \
    --controllers '*' \
    --use-service-account-credentials=true --root-ca-file "${PKI}/ca.crt" \
    --service-account-private-key-file "${PKI}/sa.key" \
    --cluster-signing-cert-file "${PKI}/ca.crt" --cluster-signing-key-file "${PKI}/ca.key" \
    --service-cluster-ip-range "${SERVICE_CIDR}" --profiling=false \
    --kube-api-qps 200 --kube-api-burst 400
  # qps/burst: the node lifecycle controller lifts the not-ready taint of new nodes through this client;
  # at the default 20 qps it freed ~4.5 nodes/s, so 1,000 fresh kwok nodes stayed unschedulable for ~4 min.
  wait_for kube-controller-manager "healthy (/healthz)" https_ok "https://127.0.0.1:${KCM_PORT}/healthz"
}

start_kwok() {
  [[ -f "${KWOK_STAGES}" ]] || die "missing ${KWOK_STAGES} (hack/tools/update-modules.sh kwok)"
  local extra=() f
  for f in "${KWOK_EXTRA_CONFIGS[@]}"; do extra+=(--config "${f}"); done
  start kwok "${BIN}/kwok" --kubeconfig "${KCFG}/kwok.kubeconfig" --config "${KWOK_STAGES}" "${extra[@]}" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
    --node-lease-duration-seconds 40 --cidr "${POD_CIDR}" --node-ip 127.0.0.1 \
    --server-address "127.0.0.1:${KWOK_PORT}"
  wait_for kwok "healthy (/healthz)" curl -sf --max-time 3 "http://127.0.0.1:${KWOK_PORT}/healthz"
}

# render_scheduler_config [FILE] -> $STATE/kube-scheduler.yaml; the given KubeSchedulerConfiguration
# with clientConnection.kubeconfig set to ours (and leaderElection.leaderElect=false if unset).
render_scheduler_config() {
  local src="${1:-}" out="${STATE}/kube-scheduler.yaml" kc="${KCFG}/kube-scheduler.kubeconfig"
  if [[ -z "${src}" ]]; then
    cat >"${out}.tmp" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: ${kc}
leaderElection:
  leaderElect: false
profiles:
- schedulerName: default-scheduler
EOF
  else
    [[ -f "${src}" ]] || die "--scheduler-config ${src}: no such file"
    "${PY}" - "${src}" "${kc}" >"${out}.tmp" <<'PY' || die "could not rewrite ${src} (needs ${PY} with PyYAML)"
import sys, yaml
src, kubeconfig = sys.argv[1], sys.argv[2]
with open(src) as f:
    doc = yaml.safe_load(f)
if not isinstance(doc, dict) or doc.get("kind") != "KubeSchedulerConfiguration":
    sys.exit(f"{src}: not a KubeSchedulerConfiguration")
doc.setdefault("clientConnection", {})["kubeconfig"] = kubeconfig
doc.setdefault("leaderElection", {"leaderElect": False})
yaml.safe_dump(doc, sys.stdout, sort_keys=False)
PY
  fi
  mv -f "${out}.tmp" "${out}"
}

start_scheduler() {
  local kc="${KCFG}/kube-scheduler.kubeconfig"
  start kube-scheduler "${BIN}/kube-scheduler" --config "${STATE}/kube-scheduler.yaml" \
    --authentication-kubeconfig "${kc}" --authorization-kubeconfig "${kc}" \
    --bind-address 127.0.0.1 --secure-port "${SCHEDULER_PORT}" \
    --tls-cert-file "${PKI}/kube-scheduler-serving.crt" --tls-private-key-file "${PKI}/kube-scheduler-serving.key"
  wait_for kube-scheduler "healthy (/healthz)" https_ok "https://127.0.0.1:${SCHEDULER_PORT}/healthz"
}

write_prometheus_config() {
  local targets_file="${1:-}" dir="${STATE}/prometheus"
  mkdir -p "${dir}/targets" "${dir}/data"
  {
    cat <<EOF
# Written by hack/local-cluster.sh up. Targets: file_sd files in ${dir}/targets/*.{json,yaml,yml}
global:
  scrape_interval: 5s
  evaluation_interval: 5s
scrape_configs:
- job_name: prometheus
  static_configs:
  - targets: ["127.0.0.1:${PROMETHEUS_PORT}"]
- job_name: rlsched
  file_sd_configs:
  - refresh_interval: 5s
    files:
    - ${dir}/targets/*.json
    - ${dir}/targets/*.yaml
    - ${dir}/targets/*.yml
EOF
    if [[ -n "${targets_file}" ]]; then echo "    - ${targets_file}"; fi
  } >"${dir}/prometheus.yml"
}

start_prometheus() {
  local prom
  prom="$(command -v prometheus || true)"
  [[ -n "${prom}" ]] || die "prometheus not found: run hack/install-system-deps.sh, or pass --no-prometheus"
  start prometheus "${prom}" --config.file "${STATE}/prometheus/prometheus.yml" \
    --storage.tsdb.path "${STATE}/prometheus/data" --storage.tsdb.retention.time 1d \
    --web.listen-address "127.0.0.1:${PROMETHEUS_PORT}" --web.enable-lifecycle
  wait_for prometheus "ready (/-/ready)" curl -sf --max-time 3 "http://127.0.0.1:${PROMETHEUS_PORT}/-/ready"
}

create_fake_nodes() {
  local n="$1" i
  ((n > 0)) || return 0
  for ((i = 0; i < n; i++)); do
    sed "s/NODE_NAME/kwok-node-${i}/g" "${REPO_ROOT}/hack/kwok/fake-node.yaml"
    echo "---"
  done | kubectl_ apply -f - >/dev/null
  local start=${SECONDS}
  until [[ "$(kubectl_poll get nodes -l type=kwok -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' \
            | grep -c '^True$')" -ge "${n}" ]]; do
    alive kwok || fail_component kwok "exited while waiting for ${n} fake nodes"
    ((SECONDS - start < TIMEOUT)) || fail_component kwok "fewer than ${n} fake nodes Ready after ${TIMEOUT}s"
    sleep 0.5
  done
  log "kwok: ${n} fake nodes Ready after $((SECONDS - start))s"
}

# ---------------------------------------------------------------- commands
require_binaries() {
  local b
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok; do
    [[ -x "${BIN}/${b}" ]] || die "${BIN}/${b} is missing: run hack/build-tools.sh (or set RLSCHED_TOOLS_BIN)"
  done
  command -v curl >/dev/null || die "curl not found (hack/install-system-deps.sh)"
  command -v ss >/dev/null || die "ss not found (hack/install-system-deps.sh)"
}

any_alive() { local c; for c in "${COMPONENTS[@]}"; do alive "${c}" && return 0; done; return 1; }

cmd_up() {
  local sched_cfg="" want_sched=true want_prom=true prom_targets="" fake_nodes=0
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --scheduler-config) sched_cfg="$(realpath "${2:?--scheduler-config needs a file}")"; shift ;;
      --no-scheduler) want_sched=false ;;
      --no-prometheus) want_prom=false ;;
      --prometheus-targets) prom_targets="$(realpath -m "${2:?--prometheus-targets needs a file}")"; shift ;;
      --fake-nodes) fake_nodes="${2:?--fake-nodes needs a number}"; shift ;;
      --kwok-config) KWOK_EXTRA_CONFIGS+=("$(realpath "${2:?--kwok-config needs a file}")"); shift ;;
      *) die "up: unknown argument $1" ;;
    esac
    shift
  done
  [[ -z "${sched_cfg}" ]] || ${want_sched} || die "--scheduler-config and --no-scheduler exclude each other"
  require_binaries

  if any_alive; then
    local c missing=()
    for c in etcd kube-apiserver kube-controller-manager kwok; do alive "${c}" || missing+=("${c}"); done
    [[ ${#missing[@]} -eq 0 ]] || die "partially up (${missing[*]} not running): run '$0 down' first"
    load_ports
    https_ok "https://127.0.0.1:${APISERVER_PORT}/readyz" || die "processes run but kube-apiserver is not ready: see $0 status"
    warn_kept_settings "${want_sched}" "${want_prom}" "${prom_targets}"
    if [[ -n "${sched_cfg}" ]]; then
      local old=""
      [[ -f "${STATE}/kube-scheduler.yaml" ]] && old="$(cat "${STATE}/kube-scheduler.yaml")"
      render_scheduler_config "${sched_cfg}"
      if ! alive kube-scheduler || [[ "${old}" != "$(cat "${STATE}/kube-scheduler.yaml")" ]]; then
        log "already up; (re)starting kube-scheduler with ${sched_cfg}"
        stop kube-scheduler
        start_scheduler
      fi
    fi
    # Fake nodes are objects, not a process setting: made on this path too (apply is idempotent).
    create_fake_nodes "${fake_nodes}"
    log "already up (state ${STATE})"
    return 0
  fi

  refuse_unverified
  local t0=${SECONDS}
  mkdir -p "${STATE}" "${LOGS}" "${RUN}"
  rm -f "${LOGS}"/*.log
  choose_ports
  gen_pki
  write_kubeconfigs
  # From here on, a failure stops whatever was started (logs stay for reading). A signal exits with
  # its own status, so the EXIT trap sees a failure (not the status of the last sleep).
  trap on_up_exit EXIT
  trap 'exit 129' HUP
  trap 'exit 130' INT
  trap 'exit 143' TERM

  start_etcd
  start_apiserver
  start_controller_manager
  start_kwok
  if ${want_sched}; then
    render_scheduler_config "${sched_cfg}"
    start_scheduler
  fi
  if ${want_prom}; then
    write_prometheus_config "${prom_targets}"
    start_prometheus
  fi
  # ServiceAccount admission rejects pods until the controller-manager made the namespace's
  # default ServiceAccount; wait so that callers can create pods right away.
  wait_for kube-controller-manager "serving ServiceAccounts (default/default exists)" kubectl_poll get serviceaccount default -n default
  create_fake_nodes "${fake_nodes}"
  trap - EXIT HUP INT TERM
  log "up in $((SECONDS - t0))s; state in ${STATE}"
  cmd_env
}

# up on a running cluster keeps its processes as they are: say which requested settings that leaves out
# (fake nodes and --scheduler-config are applied on that path; the rest needs down, then up).
warn_kept_settings() {
  local want_sched="$1" want_prom="$2" prom_targets="$3" f again="run '$0 down', then up, to change it"
  if ! ${want_sched} && alive kube-scheduler; then
    log "WARNING: already up: --no-scheduler ignored, kube-scheduler keeps running (or: $0 scheduler stop)"
  fi
  if ! ${want_prom} && alive prometheus; then
    log "WARNING: already up: --no-prometheus ignored, Prometheus keeps running; ${again}"
  elif ${want_prom} && ! alive prometheus; then
    log "WARNING: already up without Prometheus (an earlier up --no-prometheus); ${again}"
  fi
  if [[ -n "${prom_targets}" ]] && ! grep -qxF -- "    - ${prom_targets}" "${STATE}/prometheus/prometheus.yml" 2>/dev/null; then
    log "WARNING: already up: --prometheus-targets ${prom_targets} ignored (Prometheus keeps its configuration); ${again}"
  fi
  for f in "${KWOK_EXTRA_CONFIGS[@]}"; do
    if ! grep -qF -- "--config $(printf '%q' "${f}") " "${RUN}/kwok.cmd" 2>/dev/null; then
      log "WARNING: already up: --kwok-config ${f} ignored (kwok keeps the configuration it started with); ${again}"
    fi
  done
}

# A component whose pid file has no start time (an older version of this script wrote it) may still run:
# starting another one beside it would fight it for its ports and data. Ask for it to be stopped by hand.
refuse_unverified() {
  local c
  for c in "${COMPONENTS[@]}"; do
    if [[ "$(pid_verdict "${c}")" == unverified ]]; then
      die "${c}: ${RUN}/${c}.pid names pid $(pid_of "${c}"), which runs $(cat "${RUN}/${c}.exe"), but has no start" \
        "time (an older version of this script wrote it), so it is not known to be ours. If it is" \
        "(ps -o pid,lstart,args -p $(pid_of "${c}")), stop it yourself (kill -- -$(pid_of "${c}")), then run '$0 down'"
    fi
  done
}

on_up_exit() {
  local rc=$?
  if [[ ${rc} -ne 0 ]]; then
    log "up failed; stopping what was started (logs stay in ${LOGS})"
    stop_all
  fi
}

stop_all() {
  local i
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do stop "${COMPONENTS[i]}"; done
}

# Every other process with a pid file in run/: what hack/rlstack.py (hack/demo.sh) started on this cluster
# (our kube-scheduler, the extender, the operator, the load exporter) and what tests and benchmarks start
# the same way. Each is stopped only while its pid is still the process that was started: same start time
# (run/NAME.start), same executable (stop, alive); a stale pid file is just removed, and a pid file without
# a start time (an older version's) is removed with a WARNING naming the pid it leaves alone.
stop_others() {
  local f name c
  for f in "${RUN}"/*.pid; do
    [[ -e "${f}" ]] || continue
    name="$(basename "${f}" .pid)"
    for c in "${COMPONENTS[@]}"; do [[ "${name}" != "${c}" ]] || continue 2; done
    stop "${name}"
  done
}

cmd_down() {
  local keep=false
  if [[ "${1:-}" == "--keep" ]]; then keep=true; fi
  [[ $# -eq 0 ]] || ${keep} || die "down: unknown argument $1"
  load_ports || true
  stop_others  # first: they talk to the control plane
  stop_all
  # Nothing we started may still listen.
  local var left=()
  if [[ -f "${STATE}/ports.env" ]]; then
    for var in "${!PORT_DEFAULT[@]}"; do
      if [[ -n "${!var:-}" ]] && port_listening "${!var}"; then
        left+=("${var}=${!var}: $(ss -ltnpH "sport = :${!var}")")
      fi
    done
  fi
  if ! ${keep} && [[ -f "${STATE}/ports.env" ]]; then
    # Everything except logs/ (kept for post-mortems; the next up truncates them) — only in a folder
    # that up made (its ports.env): a mistyped RLSCHED_CLUSTER_DIR is left alone.
    find "${STATE}" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf {} +
    log "removed state in ${STATE} (kept ${LOGS})"
  elif ! ${keep} && [[ -d "${STATE}" ]]; then
    log "${STATE} holds no cluster state (no ports.env): nothing removed"
  fi
  if [[ ${#left[@]} -gt 0 ]]; then
    log "WARNING: ports still listening (not processes started by this script?):"
    printf '  %s\n' "${left[@]}" >&2
    return 1
  fi
  log "down"
}

cmd_status() {
  if ! load_ports; then echo "no cluster state in ${STATE}"; return 3; fi
  local c state pid up=0
  printf '%-24s %-8s %-8s %-7s %s\n' COMPONENT STATE PID PORT LOG
  for c in "${COMPONENTS[@]}"; do
    pid="-"; state="stopped"
    case "$(pid_verdict "${c}")" in
      ours) state="running"; pid="$(pid_of "${c}")"; up=$((up + 1)) ;;
      unverified) state="unknown"; pid="$(pid_of "${c}")?" ;;  # an older version's pid file: see down
    esac
    printf '%-24s %-8s %-8s %-7s %s\n' "${c}" "${state}" "${pid}" "$(port_of "${c}")" "${LOGS}/${c}.log"
  done
  printf '%-24s %-8s %-8s %-7s\n' etcd-peer - - "${ETCD_PEER_PORT}"
  if alive kube-apiserver && https_ok "https://127.0.0.1:${APISERVER_PORT}/readyz"; then
    echo "kube-apiserver /readyz: ok (https://127.0.0.1:${APISERVER_PORT})"
    kubectl_poll get nodes --no-headers 2>/dev/null | awk '{n++; if ($2 == "Ready") r++} END {printf "nodes: %d (%d Ready)\n", n, r}'
  else
    echo "kube-apiserver /readyz: not ready"
  fi
  echo "KUBECONFIG=${ADMIN_KUBECONFIG}"
  ((up > 0))
}

cmd_env() {
  load_ports || die "no cluster state in ${STATE}: run '$0 up'"
  # Quoted for the shell (%q): eval "$(hack/local-cluster.sh env)" works with spaces in paths.
  printf 'export KUBECONFIG=%q\n' "${ADMIN_KUBECONFIG}"
  printf 'export RLSCHED_CLUSTER_DIR=%q\n' "${STATE}"
  printf 'export RLSCHED_APISERVER_URL=%q\n' "https://127.0.0.1:${APISERVER_PORT}"
  printf 'export RLSCHED_ETCD_URL=%q\n' "http://127.0.0.1:${ETCD_PORT}"
  printf 'export RLSCHED_PROMETHEUS_URL=%q\n' "http://127.0.0.1:${PROMETHEUS_PORT}"
  printf 'export RLSCHED_PROMETHEUS_TARGETS_DIR=%q\n' "${STATE}/prometheus/targets"
  # shellcheck disable=SC2016  # ${PATH} is for the shell that evaluates this line
  printf 'export PATH=%q:"${PATH}"\n' "${BIN}"
}

cmd_scheduler() {
  local action="${1:-}" cfg=""; shift || true
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --scheduler-config) cfg="$(realpath "${2:?--scheduler-config needs a file}")"; shift ;;
      *) die "scheduler: unknown argument $1" ;;
    esac
    shift
  done
  load_ports || die "no cluster state in ${STATE}: run '$0 up'"
  case "${action}" in
    start)
      alive kube-apiserver || die "kube-apiserver is not running: run '$0 up'"
      stop kube-scheduler
      render_scheduler_config "${cfg}"
      start_scheduler ;;
    stop) stop kube-scheduler ;;
    *) die "usage: $0 scheduler start [--scheduler-config FILE] | stop" ;;
  esac
}

main() {
  local cmd="${1:-}"; shift || true
  case "${cmd}" in
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    status) cmd_status "$@" ;;
    env) cmd_env "$@" ;;
    scheduler) cmd_scheduler "$@" ;;
    -h|--help|help) sed -n '2,24p' "${BASH_SOURCE[0]}" ;;
    *) sed -n '8,14p' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
  esac
}

# Sourced (the unit tests call single functions): define them, run nothing.
[[ "${BASH_SOURCE[0]}" != "$0" ]] || main "$@"
