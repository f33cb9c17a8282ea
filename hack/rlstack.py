#!/usr/bin/env python3
"""The rl-scheduler stack as local processes on a ``hack/local-cluster.sh`` cluster.

``hack/local-cluster.sh`` runs the control plane (etcd, kube-apiserver, kube-controller-manager,
kwok, the default kube-scheduler, Prometheus). This module adds what a Helm install would add, as
plain processes on loopback, each with a pid file in ``<state>/run/`` and a log in ``<state>/logs/``
(so that ``down`` — or anyone reading the pid file — can stop exactly what was started):

- ``rl-kube-scheduler``: a **second** kube-scheduler (same binary) with the configuration rendered
  by :func:`rlsched.extender.scheduler_config.scheduler_config` — profile ``rl-scheduler``, our
  extender on loopback, leader election on its own lease ``kube-system/rl-scheduler`` (the RBAC grant
  the chart makes is applied here too). The cluster's own kube-scheduler keeps serving
  ``default-scheduler``: kube-scheduler's ``extenders:`` apply to every profile of a process, so the
  two profiles cannot share one process without the default one calling our extender too.
- ``rlsched-extender``: ``rlsched extender`` serving the model the chart serves when it is installed
  (:data:`rlsched.policy.learned.SERVED_MODEL`), the FGD fallback otherwise. Its /status and
  /decisions need a bearer token (``auth.mode: kubernetes``, the extender's default); it runs with
  the admin kubeconfig (group system:masters), which may create the TokenReviews and
  SubjectAccessReviews that checking takes (in a cluster: the ClusterRole system:auth-delegator).
- ``rlsched-operator`` (optional): ``rlsched operator`` publishing a SchedulingPolicy into a folder the
  extender reads, sending the token of the ServiceAccount ``kube-system/rlsched-operator``.

Who reads the status listener: the ServiceAccounts :data:`STACK_IDENTITY` (this module's
``Extender.status()``/``decisions()``, the demo) and :data:`OPERATOR_IDENTITY`, bound to the ClusterRole
:data:`READER_ROLE` (``get`` on the non-resource URLs /status, /decisions, /metrics); their tokens come
from the TokenRequest API (``kubectl create token``) into ``<state>/rlstack/tokens/`` (:func:`service_account_token`).
- ``rlsched-load-exporter`` (optional): ``hack/load_exporter.py``, node-exporter series per kwok node,
  registered with the cluster's Prometheus, which the extender queries.

Used by ``hack/demo.sh``, ``tests/e2e/test_extender_*.py``, ``benchmarks/scheduler_throughput.py`` and
``hack/replay_openb.py``; also a CLI::

    hack/rlstack.py up [--operator] [--load-exporter] [--model PATH|auto|none]   # on a running cluster
    hack/rlstack.py status
    hack/rlstack.py down

Besides the processes it has the object builders every caller shares: :func:`kwok_node` (a fake
node with cpu, memory, ``nvidia.com/gpu`` and a card model) and :func:`pod_manifest` (a pod asking
whole cards, a share or a model in the conventions of docs/gpu-sharing.md), and a small asyncio
client of the API server (:class:`Api`) for bulk creation and watches.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
TOOLS_BIN = Path(os.environ.get("RLSCHED_TOOLS_BIN", REPO_ROOT / ".tools" / "bin"))
SCHEDULER_NAME = "rl-scheduler"
LEASE_NAME = "rl-scheduler"
LEASE_NAMESPACE = "kube-system"

GPU_RESOURCE = "nvidia.com/gpu"
GPU_MILLI_RESOURCE = "rlsched.io/gpu-milli"
GPU_MODEL_LABEL = "rlsched.io/gpu-model"
GPU_MODELS_ANNOTATION = "rlsched.io/gpu-models"
GPU_MILLI_ANNOTATION = "rlsched.io/gpu-milli"
CARDS_ANNOTATION = "rlsched.io/gpu-cards"
CARD_MILLI_ANNOTATION = "rlsched.io/gpu-card-milli"
GPU_NODE_ANNOTATION = "rlsched.io/gpu-node"


def log(msg: str) -> None:
    print(f"[rlstack {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(
    fn: Callable[[], Any], timeout: float, what: str, interval: float = 0.3, alive: Callable[[], bool] | None = None
) -> Any:
    """Poll ``fn`` until it returns something truthy; AssertionError with the last value on timeout."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except Exception as exc:  # noqa: BLE001 - keep polling; report the last problem
            last = exc
        else:
            if last:
                return last
        if alive is not None and not alive():
            raise AssertionError(f"process died while waiting for {what}; last: {last!r}")
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")


LOCAL_RATE_WINDOW_S = 30
"""Rate window of the local stack's load queries. The local Prometheus scrapes every 5 s, so 30 s holds
six scrapes; a new node's cpu, network and disk rates are then right after 30 s instead of after the
default queries' 2 minutes (Prometheus divides a young series' increase by the whole window)."""


def local_load_queries() -> dict[str, str]:
    """The extender's default PromQL with :data:`LOCAL_RATE_WINDOW_S` rate windows."""
    from rlsched.extender.settings import DEFAULT_QUERIES

    return {k: v.replace("[2m]", f"[{LOCAL_RATE_WINDOW_S}s]") for k, v in DEFAULT_QUERIES.items()}


def bundled_model() -> Path | None:
    """The packaged model the chart serves (policy/models/), else None."""
    try:
        from rlsched.policy.learned import SERVED_MODEL
    except Exception:  # noqa: BLE001 - the policy package is importable in every supported setup
        return None
    return SERVED_MODEL if SERVED_MODEL.is_file() else None


# -- the cluster -------------------------------------------------------------------------------------


@dataclass
class LocalCluster:
    """A cluster started by ``hack/local-cluster.sh up`` (its state folder)."""

    state_dir: Path
    tools_bin: Path = TOOLS_BIN

    @classmethod
    def from_env(cls, state_dir: str | Path | None = None) -> LocalCluster:
        state = Path(state_dir or os.environ.get("RLSCHED_CLUSTER_DIR") or REPO_ROOT / ".cache" / "cluster")
        return cls(state.resolve())

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.state_dir / "pki"

    @property
    def run_dir(self) -> Path:
        return self.state_dir / "run"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def stack_dir(self) -> Path:
        """Files of this module's processes (configs, policy folder, decision log)."""
        return self.state_dir / "rlstack"

    def ports(self) -> dict[str, int]:
        path = self.state_dir / "ports.env"
        if not path.exists():
            raise RuntimeError(f"no cluster state in {self.state_dir}: run hack/local-cluster.sh up")
        out = {}
        for line in path.read_text().splitlines():
            if "=" in line:
                k, v = line.split("=", 1)
                out[k.strip()] = int(v)
        return out

    @property
    def apiserver_url(self) -> str:
        return f"https://127.0.0.1:{self.ports()['APISERVER_PORT']}"

    @property
    def prometheus_url(self) -> str | None:
        """The cluster's Prometheus if it runs (``up`` without ``--no-prometheus``)."""
        if not (self.run_dir / "prometheus.pid").exists():
            return None
        return f"http://127.0.0.1:{self.ports()['PROMETHEUS_PORT']}"

    @property
    def prometheus_targets_dir(self) -> Path:
        return self.state_dir / "prometheus" / "targets"

    def env(self) -> dict[str, str]:
        return dict(
            os.environ,
            KUBECONFIG=str(self.kubeconfig),
            RLSCHED_CLUSTER_DIR=str(self.state_dir),
            PATH=f"{self.tools_bin}:{os.environ.get('PATH', '')}",
        )

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [str(self.tools_bin / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        return done

    def apply(self, objects: Iterable[Mapping[str, Any]], server_side: bool = False) -> None:
        docs = list(objects)
        if not docs:
            return
        args = ["apply", "-f", "-"] + (["--server-side", "--force-conflicts"] if server_side else [])
        self.kubectl(*args, input=yaml.safe_dump_all(docs), timeout=600)

    def ssl_context(self) -> ssl.SSLContext:
        """TLS to the API server as the admin user (client certificate)."""
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx


# -- processes ---------------------------------------------------------------------------------------


class Proc:
    """A background process with ``<state>/run/<name>.{pid,exe,cmd}`` and ``<state>/logs/<name>.log``,
    in its own session (process group). Stopping checks that the pid still runs what was started."""

    def __init__(self, cluster: LocalCluster, name: str):
        self.cluster, self.name = cluster, name
        self.popen: subprocess.Popen | None = None
        self.argv: list[str] | None = None
        self.env: dict[str, str] | None = None

    @property
    def log_path(self) -> Path:
        return self.cluster.log_dir / f"{self.name}.log"

    def _file(self, ext: str) -> Path:
        return self.cluster.run_dir / f"{self.name}.{ext}"

    @property
    def pid(self) -> int | None:
        try:
            return int(self._file("pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def alive(self) -> bool:
        pid = self.pid
        if pid is None:
            return False
        if self.popen is not None and self.popen.pid == pid:
            # Started by this process: the child's exit status is the truth. (The /proc check below is
            # for processes another invocation started; reading a busy child's cmdline can mislead.)
            return self.popen.poll() is None
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:
            return False
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
        try:
            return cmd == self._file("exe").read_text().strip()
        except OSError:
            return False

    def start(self, argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: Path | None = None) -> None:
        if self.alive():
            raise RuntimeError(f"{self.name} already runs (pid {self.pid}); stop it first")
        self.cluster.run_dir.mkdir(parents=True, exist_ok=True)
        self.cluster.log_dir.mkdir(parents=True, exist_ok=True)
        # PYTHONSAFEPATH: with cwd at the repository root, `python -m` would otherwise find the `operator/`
        # folder before the standard library's `operator` (hack/test.sh explains).
        env = dict(env if env is not None else os.environ, PYTHONSAFEPATH="1")
        self.argv, self.env = list(map(str, argv)), env
        logf = open(self.log_path, "ab")
        try:
            self.popen = subprocess.Popen(
                list(argv),
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
                cwd=str(cwd) if cwd else None,
            )
        finally:
            logf.close()
        self._file("pid").write_text(f"{self.popen.pid}\n")
        self._file("exe").write_text(f"{argv[0]}\n")
        self._file("cmd").write_text(" ".join(map(str, argv)) + "\n")

    def _running(self, pid: int) -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        return state != "Z"

    def signal(self, sig: int) -> None:
        if self.alive():
            os.killpg(self.pid, sig)  # type: ignore[arg-type]

    def kill(self) -> None:
        """SIGKILL, no grace (tests: a crash)."""
        pid = self.pid
        if pid is not None and self.alive():
            os.killpg(pid, signal.SIGKILL)
            wait_for(lambda: not self._running(pid), 10, f"{self.name} to die", interval=0.05)
        self._reap()

    def stop(self, timeout: float = 15) -> None:
        pid = self.pid
        if pid is not None and self.alive():
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + timeout
            while self._running(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if self._running(pid):
                log(f"{self.name}: pid {pid} ignored SIGTERM for {timeout:.0f}s; SIGKILL")
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self._reap()
        for ext in ("pid", "exe", "cmd"):
            self._file(ext).unlink(missing_ok=True)

    def _reap(self) -> None:
        if self.popen is not None:
            try:
                self.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def exit_note(self) -> str:
        """' (exit status N)' / ' (killed by signal S)' when this process started it and it has ended."""
        code = self.popen.poll() if self.popen is not None else None
        if code is None:
            return ""
        return f" (killed by signal {-code})" if code < 0 else f" (exit status {code})"

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def http_get(
    url: str, timeout: float = 3, context: ssl.SSLContext | None = None, token: str | None = None
) -> tuple[int, bytes]:
    """(status, body) of a GET; ``token``: sent as ``Authorization: Bearer``."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


# -- who may read the extender's status listener --------------------------------------------------------

READER_ROLE = "rlsched-extender-reader"
"""ClusterRole: ``get`` on the extender's /status, /decisions and /metrics (non-resource URLs, which the
extender checks with a SubjectAccessReview)."""
STACK_IDENTITY = "rlsched-stack"
"""ServiceAccount of this harness's own reads (``Extender.status()`` …) and of the demo."""
OPERATOR_IDENTITY = "rlsched-operator"
"""ServiceAccount whose token the local operator sends to the extender."""
IDENTITY_NAMESPACE = "kube-system"


def reader_rbac(account: str, namespace: str = IDENTITY_NAMESPACE, grant: bool = True) -> list[dict]:
    """The ServiceAccount ``account`` and, with ``grant``, a binding to :data:`READER_ROLE`."""
    objs: list[dict] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": namespace}}
    ]
    if grant:
        objs += [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": READER_ROLE},
                "rules": [{"nonResourceURLs": ["/status", "/decisions", "/metrics"], "verbs": ["get"]}],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": f"{READER_ROLE}-{account}"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": READER_ROLE},
                "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
            },
        ]
    return objs


def service_account_token(
    cluster: LocalCluster, account: str, grant: bool = True, namespace: str = IDENTITY_NAMESPACE, duration: str = "24h"
) -> Path:
    """Create the ServiceAccount (bound to :data:`READER_ROLE` with ``grant``), request a token for it
    (TokenRequest API) and write it to ``<state>/rlstack/tokens/<account>.token`` (mode 0600)."""
    cluster.apply(reader_rbac(account, namespace, grant))
    token = cluster.kubectl("create", "token", account, "-n", namespace, "--duration", duration).stdout.strip()
    folder = cluster.stack_dir / "tokens"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{account}.token"
    tmp = folder / f".{account}.token.tmp"
    tmp.write_text(token + "\n")
    tmp.chmod(0o600)
    tmp.replace(path)  # atomic, like the kubelet's rotation: a reader sees the old token or the new one
    return path


# -- kube-scheduler ----------------------------------------------------------------------------------


def rl_scheduler_config(
    cluster: LocalCluster,
    extender_url: str | None,
    *,
    scheduler_name: str = SCHEDULER_NAME,
    leader_elect: bool = True,
    lease_name: str = LEASE_NAME,
    qps: float | None = None,
    burst: int | None = None,
    default_profile: bool = False,
    tls: Any = None,
    percentage_of_nodes_to_score: int = 0,
) -> dict[str, Any]:
    """Our KubeSchedulerConfiguration (``rlsched.extender.scheduler_config``) pointed at this cluster.

    ``extender_url`` None drops the extender (the benchmark's baseline); ``default_profile`` replaces our
    profile by a stock one (every plugin, default percentageOfNodesToScore) under ``scheduler_name``.
    ``qps``/``burst`` set ``clientConnection`` (kube-scheduler's defaults are 50/100);
    ``percentage_of_nodes_to_score`` as in ``scheduler_config``. ``tls``: a
    :class:`rlsched.extender.scheduler_config.ClientTls` — call the extender over mutual TLS (https URL).
    """
    from rlsched.extender.scheduler_config import scheduler_config

    conf = scheduler_config(
        url=extender_url or "http://127.0.0.1:1",
        scheduler_name=scheduler_name,
        lease_name=lease_name,
        leader_elect=leader_elect,
        tls=tls,
        kubeconfig=str(cluster.state_dir / "kubeconfigs" / "kube-scheduler.kubeconfig"),
        percentage_of_nodes_to_score=percentage_of_nodes_to_score,
    )
    if extender_url is None:
        del conf["extenders"]
    if default_profile:
        conf["profiles"] = [{"schedulerName": scheduler_name}]
        conf.pop("percentageOfNodesToScore", None)
    if qps is not None:
        conf["clientConnection"]["qps"] = qps
    if burst is not None:
        conf["clientConnection"]["burst"] = burst
    return conf


def lease_rbac(
    lease: str = LEASE_NAME, namespace: str = LEASE_NAMESPACE, user: str = "system:kube-scheduler"
) -> list[dict]:
    """The grant a second scheduler needs for its own lease (the built-in ``system:kube-scheduler``
    role may only get/update the lease named ``kube-scheduler``; create is already allowed)."""
    name = f"{lease}-leader-election"
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name, "namespace": namespace},
            "rules": [
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "resourceNames": [lease],
                    "verbs": ["get", "update"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    ]


class KubeScheduler(Proc):
    """A kube-scheduler of our own next to the cluster's (which keeps ``default-scheduler``)."""

    def __init__(self, cluster: LocalCluster, name: str = "rl-kube-scheduler"):
        super().__init__(cluster, name)
        self.port: int | None = None
        self.config: dict[str, Any] | None = None

    def start_with(
        self,
        config: Mapping[str, Any],
        port: int | None = None,
        verbosity: int = 2,
        timeout: float = 120,
        profiling: bool = False,
    ) -> None:
        """``profiling``: also serve ``/debug/pprof/*`` without authorization (loopback only), for
        :meth:`cpu_profile`."""
        c = self.cluster
        c.stack_dir.mkdir(parents=True, exist_ok=True)
        path = c.stack_dir / f"{self.name}.yaml"
        path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
        if config.get("leaderElection", {}).get("leaderElect"):
            le = config["leaderElection"]
            c.apply(lease_rbac(le.get("resourceName", LEASE_NAME), le.get("resourceNamespace", LEASE_NAMESPACE)))
        self.port = port or free_port()
        self.config = dict(config)
        kc = c.state_dir / "kubeconfigs" / "kube-scheduler.kubeconfig"
        self.start(
            [
                str(c.tools_bin / "kube-scheduler"),
                "--config",
                str(path),
                "--authentication-kubeconfig",
                str(kc),
                "--authorization-kubeconfig",
                str(kc),
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                str(self.port),
                "--tls-cert-file",
                str(c.pki / "kube-scheduler-serving.crt"),
                "--tls-private-key-file",
                str(c.pki / "kube-scheduler-serving.key"),
                "--authorization-always-allow-paths",
                "/healthz,/readyz,/livez,/metrics" + (",/debug/pprof/*" if profiling else ""),
                f"--v={verbosity}",
            ]
        )
        ctx = ssl.create_default_context(cafile=str(c.pki / "ca.crt"))
        try:
            wait_for(
                lambda: http_get(f"https://127.0.0.1:{self.port}/healthz", context=ctx)[0] == 200,
                timeout,
                f"{self.name} /healthz",
                alive=self.alive,
            )
        except AssertionError as exc:
            raise RuntimeError(f"{exc}{self.exit_note()}\n--- {self.log_path} ---\n{self.tail()}") from None

    def metrics(self) -> str:
        ctx = ssl.create_default_context(cafile=str(self.cluster.pki / "ca.crt"))
        status, body = http_get(f"https://127.0.0.1:{self.port}/metrics", timeout=10, context=ctx)
        if status != 200:
            raise RuntimeError(f"{self.name} /metrics: HTTP {status}")
        return body.decode()

    def cpu_profile(self, seconds: float) -> bytes:
        """A Go CPU profile (pprof format) over the next ``seconds``; needs ``start_with(profiling=True)``."""
        ctx = ssl.create_default_context(cafile=str(self.cluster.pki / "ca.crt"))
        url = f"https://127.0.0.1:{self.port}/debug/pprof/profile?seconds={seconds:g}"
        status, body = http_get(url, timeout=seconds + 30, context=ctx)
        if status != 200:
            raise RuntimeError(f"{self.name} {url}: HTTP {status}")
        return body


# -- extender, operator, load exporter ---------------------------------------------------------------


class Extender(Proc):
    """``rlsched extender`` against this cluster (admin credentials), verbs and status on loopback.
    Reads of /status, /decisions and /metrics carry the token of :data:`STACK_IDENTITY`."""

    def __init__(self, cluster: LocalCluster, name: str = "rlsched-extender"):
        super().__init__(cluster, name)
        self.port: int | None = None
        self.status_port: int | None = None
        self.token_path: Path | None = None

    @property
    def token(self) -> str | None:
        """The reader token (None before :meth:`start_with` has made one)."""
        try:
            return self.token_path.read_text().strip() if self.token_path else None
        except OSError:
            return None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def status_url(self) -> str:
        return f"http://127.0.0.1:{self.status_port}"

    def start_with(
        self,
        port: int | None = None,
        status_port: int | None = None,
        model: str | Path | None = None,
        policy_file: str | Path | None = None,
        prometheus_url: str | None = None,
        settings: Mapping[str, Any] | None = None,
        extra: Sequence[str] = (),
        timeout: float = 120,
    ) -> None:
        """Start and wait for /readyz. ``settings``: extender config-file keys (camelCase, nested)."""
        c = self.cluster
        c.stack_dir.mkdir(parents=True, exist_ok=True)
        self.port = port or self.port or free_port()
        self.status_port = status_port or self.status_port or free_port()
        conf: dict[str, Any] = {"log": {"format": "json"}}
        for key, value in (settings or {}).items():
            if isinstance(value, Mapping) and isinstance(conf.get(key), dict):
                conf[key].update(value)
            else:
                conf[key] = value
        if prometheus_url:
            conf.setdefault("prometheus", {})["url"] = prometheus_url
        cfg = c.stack_dir / f"{self.name}.yaml"
        cfg.write_text(yaml.safe_dump(conf, sort_keys=False))
        self.token_path = service_account_token(c, STACK_IDENTITY)
        # RLSCHED_STACK_EXTENDER_LAUNCHER: another command instead of `python -m rlsched.cli` (experiments
        # with a patched extender that must not touch the working tree).
        launcher = os.environ.get("RLSCHED_STACK_EXTENDER_LAUNCHER", "").split() or [
            sys.executable,
            "-m",
            "rlsched.cli",
        ]
        argv = [
            *launcher,
            "extender",
            "--config",
            str(cfg),
            "--kubeconfig",
            str(c.kubeconfig),
            "--port",
            str(self.port),
            "--status-port",
            str(self.status_port),
            "--status-host",
            "127.0.0.1",
        ]
        if model:
            argv += ["--model", str(model), "--no-strict-model"]
        if policy_file:
            argv += ["--policy-file", str(policy_file)]
        argv += list(extra)
        # The extender reads RLSCHED_* from its environment: keep the caller's out of it (a shell
        # with `eval "$(hack/local-cluster.sh env)"` exports RLSCHED_PROMETHEUS_URL, for instance).
        env = {k: v for k, v in os.environ.items() if not k.startswith("RLSCHED_")}
        self.start(argv, env=env, cwd=REPO_ROOT)
        try:
            wait_for(
                lambda: http_get(f"{self.status_url}/readyz")[0] == 200,
                timeout,
                f"{self.name} /readyz",
                alive=self.alive,
            )
        except AssertionError as exc:
            raise RuntimeError(f"{exc}{self.exit_note()}\n--- {self.log_path} ---\n{self.tail()}") from None

    def restart(self, timeout: float = 120) -> None:
        """Start again with the same command line and ports (after :meth:`kill` or :meth:`stop`)."""
        if self.argv is None:
            raise RuntimeError(f"{self.name}: not started by this process")
        self.start(self.argv, env=self.env, cwd=REPO_ROOT)
        wait_for(
            lambda: http_get(f"{self.status_url}/readyz")[0] == 200, timeout, f"{self.name} /readyz", alive=self.alive
        )

    def status(self) -> dict[str, Any]:
        code, body = http_get(f"{self.status_url}/status", token=self.token)
        if code != 200:
            raise RuntimeError(f"{self.name} /status: HTTP {code}: {body[:300]!r}")
        return json.loads(body)

    def decisions(self, after: int = 0, limit: int = 4096) -> dict[str, Any]:
        code, body = http_get(f"{self.status_url}/decisions?after={after}&limit={limit}", timeout=10, token=self.token)
        if code != 200:
            raise RuntimeError(f"{self.name} /decisions: HTTP {code}: {body[:300]!r}")
        return json.loads(body)

    def metrics(self) -> str:
        return http_get(f"{self.status_url}/metrics", token=self.token)[1].decode()


def describe_policy(status: Mapping[str, Any]) -> str:
    """One line saying which policy serves, from the extender's /status."""
    p = status.get("policy", {})
    model = p.get("model") or {}
    if model.get("loaded") and p.get("mode") == "active":
        return (
            f"learned model {model.get('version')} ({model.get('path')}, sha256 {str(model.get('digest'))[:12]}…), "
            f"mode active, fallback {p.get('fallback')}"
        )
    why = (
        "no model configured"
        if not model.get("path")
        else f"model {model.get('path')} not loaded: {model.get('error')}"
    )
    if model.get("loaded"):
        why = f"model {model.get('version')} loaded but mode {p.get('mode')}"
    return f"heuristic {p.get('fallback')} (fallback: {why})"


class Operator(Proc):
    """``rlsched operator`` publishing into a folder the extender reads (``--sink directory``)."""

    def __init__(self, cluster: LocalCluster, name: str = "rlsched-operator"):
        super().__init__(cluster, name)

    def start_with(
        self,
        namespace: str,
        extender_status_url: str,
        policy_dir: Path,
        decision_log: Path | None = None,
        prometheus_url: str | None = None,
        extra: Sequence[str] = (),
        timeout: float = 120,
    ) -> None:
        policy_dir.mkdir(parents=True, exist_ok=True)
        start_len = self.log_path.stat().st_size if self.log_path.exists() else 0
        token = service_account_token(self.cluster, OPERATOR_IDENTITY)
        argv = [
            sys.executable,
            "-m",
            "rlsched.cli",
            "operator",
            "--kubeconfig",
            str(self.cluster.kubeconfig),
            "--install-crds",
            "--namespace",
            namespace,
            "--policy",
            f"{namespace}/default",
            "--sink",
            "directory",
            "--directory",
            str(policy_dir),
            "--extender-url",
            extender_status_url,
            "--extender-token-file",
            str(token),
            "--status-interval",
            "5",
        ]
        if decision_log:
            argv += ["--decision-log", str(decision_log)]
        if prometheus_url:
            argv += ["--prometheus-url", prometheus_url]
        argv += list(extra)
        env = {k: v for k, v in os.environ.items() if not k.startswith("RLSCHED_")}
        self.start(argv, env=env, cwd=REPO_ROOT)

        def started() -> bool:
            with open(self.log_path, "rb") as f:
                f.seek(start_len)
                return b"operator started" in f.read()

        try:
            wait_for(started, timeout, f"{self.name} to start", alive=self.alive)
        except AssertionError as exc:
            raise RuntimeError(f"{exc}{self.exit_note()}\n--- {self.log_path} ---\n{self.tail()}") from None


class LoadExporter(Proc):
    """``hack/load_exporter.py``: node-exporter series for the cluster's nodes, registered with Prometheus."""

    def __init__(self, cluster: LocalCluster, name: str = "rlsched-load-exporter"):
        super().__init__(cluster, name)
        self.port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start_with(
        self,
        port: int | None = None,
        node_selector: str | None = None,
        refresh_s: float = 2.0,
        targets_dir: Path | None = None,
        timeout: float = 60,
        extra: Sequence[str] = (),
    ) -> None:
        """Start and wait for /healthz. ``extra``: more arguments (``--usage-annotations``)."""
        self.port = port or free_port()
        argv = [
            sys.executable,
            str(REPO_ROOT / "hack" / "load_exporter.py"),
            "--kubeconfig",
            str(self.cluster.kubeconfig),
            "--port",
            str(self.port),
            "--refresh",
            str(refresh_s),
        ]
        tdir = targets_dir or (self.cluster.prometheus_targets_dir if self.cluster.prometheus_url else None)
        if tdir:
            argv += ["--targets-dir", str(tdir)]
        if node_selector:
            argv += ["--node-selector", node_selector]
        argv += list(extra)
        self.start(argv, cwd=REPO_ROOT)
        try:
            wait_for(
                lambda: http_get(f"{self.url}/healthz")[0] == 200, timeout, f"{self.name} /healthz", alive=self.alive
            )
        except AssertionError as exc:
            raise RuntimeError(f"{exc}{self.exit_note()}\n--- {self.log_path} ---\n{self.tail()}") from None

    def loads(self) -> dict[str, dict[str, float]]:
        """node → the utilizations it publishes now (cpu, memory, network, disk: 0..1)."""
        return json.loads(http_get(f"{self.url}/loads")[1])

    def pin(self, node: str, **values: float) -> None:
        """Fix a node's utilizations (``cpu=0.8``) instead of the pod-driven model."""
        req = urllib.request.Request(
            f"{self.url}/loads/{node}",
            data=json.dumps(values).encode(),
            method="PUT",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            resp.read()


def prometheus_query(url: str, promql: str) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"query": promql})
    code, body = http_get(f"{url}/api/v1/query?{q}", timeout=10)
    if code != 200:
        raise RuntimeError(f"Prometheus {url}: HTTP {code}: {body[:200]!r}")
    return json.loads(body)["data"]["result"]


# -- test certificates -------------------------------------------------------------------------------


def tls_pki(folder: Path, name: str = "rlsched-test") -> dict[str, Path]:
    """A throwaway CA in ``folder`` (openssl) and, signed by it, a server certificate for 127.0.0.1 /
    localhost and a client certificate: the files of the verbs' mutual TLS (``server.tls``, kube-scheduler's
    ``tlsConfig``). Keys: ``ca``, ``server_cert``, ``server_key``, ``client_cert``, ``client_key``."""
    folder.mkdir(parents=True, exist_ok=True)
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    out = {"ca": folder / "ca.crt", "ca_key": folder / "ca.key"}

    def openssl(*args: str) -> None:
        done = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip()[-1000:]}")

    openssl(
        "req",
        "-x509",
        *key,
        "-keyout",
        str(out["ca_key"]),
        "-out",
        str(out["ca"]),
        "-days",
        "2",
        "-subj",
        f"/CN={name}-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    for role, cn, ext in (
        ("server", "rlsched-extender", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth"),
        ("client", "kube-scheduler", "extendedKeyUsage=clientAuth"),
    ):
        k, csr, crt, extfile = (folder / f"{role}.{x}" for x in ("key", "csr", "crt", "ext"))
        extfile.write_text(
            ext + "\nkeyUsage=critical,digitalSignature\n"
            "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
        )
        openssl("req", *key, "-keyout", str(k), "-out", str(csr), "-subj", f"/CN={cn}")
        openssl(
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            str(out["ca"]),
            "-CAkey",
            str(out["ca_key"]),
            "-CAcreateserial",
            "-out",
            str(crt),
            "-days",
            "2",
            "-extfile",
            str(extfile),
        )
        out[f"{role}_cert"], out[f"{role}_key"] = crt, k
    return out


# -- objects -----------------------------------------------------------------------------------------


def kwok_node(
    name: str,
    cpu_milli: int,
    memory_mib: int,
    gpus: int = 0,
    model: str = "",
    labels: Mapping[str, str] | None = None,
    max_pods: int = 1000,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A fake node kwok keeps Ready: cpu, memory, ``nvidia.com/gpu`` cards of one model (docs/gpu-sharing.md)."""
    res = {"cpu": f"{cpu_milli}m", "memory": f"{memory_mib}Mi", "pods": str(max_pods)}
    node_labels = {
        "type": "kwok",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
    }
    if gpus:
        res[GPU_RESOURCE] = str(gpus)
        node_labels[GPU_MODEL_LABEL] = model
    node_labels.update(labels or {})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": node_labels,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0", **(annotations or {})},
        },
        "status": {"capacity": dict(res), "allocatable": dict(res)},
    }


def pod_manifest(
    name: str,
    cpu_milli: int,
    memory_mib: int,
    num_gpu: int = 0,
    gpu_milli: int = 0,
    gpu_models: Sequence[str] = (),
    scheduler_name: str = SCHEDULER_NAME,
    namespace: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
    share_as_annotation: bool = False,
    priority_class: str | None = None,
) -> dict[str, Any]:
    """A pod in our GPU conventions: ``num_gpu`` whole cards (``gpu_milli`` 1000) as ``nvidia.com/gpu``,
    a share of one card (``num_gpu`` 1, ``gpu_milli`` < 1000) as ``rlsched.io/gpu-milli`` (or the
    annotation), a model restriction as ``rlsched.io/gpu-models``."""
    res: dict[str, str] = {"cpu": f"{cpu_milli}m", "memory": f"{memory_mib}Mi"}
    ann = dict(annotations or {})
    if num_gpu and gpu_milli >= 1000:
        res[GPU_RESOURCE] = str(num_gpu)
    elif num_gpu:
        if share_as_annotation:
            ann[GPU_MILLI_ANNOTATION] = str(gpu_milli)
        else:
            res[GPU_MILLI_RESOURCE] = str(gpu_milli)
    if gpu_models:
        ann[GPU_MODELS_ANNOTATION] = "|".join(gpu_models)
    meta: dict[str, Any] = {"name": name, "labels": dict(labels or {})}
    if namespace:
        meta["namespace"] = namespace
    if ann:
        meta["annotations"] = ann
    spec: dict[str, Any] = {
        "schedulerName": scheduler_name,
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "main",
                "image": "registry.example.com/job:1",
                "resources": {"requests": dict(res), "limits": dict(res)},
            }
        ],
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def pod_from_spec(spec: Any, name: str | None = None, **kwargs: Any) -> dict[str, Any]:
    """:func:`pod_manifest` for a :class:`rlsched.policy.cluster.PodSpec` (trace pods)."""
    return pod_manifest(
        name or k8s_name(spec.name),
        spec.cpu_milli,
        spec.memory_mib,
        spec.num_gpu,
        spec.gpu_milli,
        spec.gpu_models,
        **kwargs,
    )


def k8s_name(name: str) -> str:
    """A DNS-1123 name for a trace name (lowercase; ``_`` → ``-``)."""
    return name.lower().replace("_", "-").replace(".", "-")


def card_assignment(pod: Mapping[str, Any]) -> tuple[str, tuple[int, ...], int] | None:
    """(node, cards, milli per card) from bind's annotations; None when the pod has none."""
    ann = pod.get("metadata", {}).get("annotations") or {}
    if CARDS_ANNOTATION not in ann:
        return None
    cards = tuple(int(c) for c in ann[CARDS_ANNOTATION].split(",") if c.strip() != "")
    return ann.get(GPU_NODE_ANNOTATION, ""), cards, int(ann.get(CARD_MILLI_ANNOTATION, "0") or 0)


# -- a small asyncio API client ----------------------------------------------------------------------


class ApiError(RuntimeError):
    def __init__(self, status: int, body: str, what: str):
        super().__init__(f"{what}: HTTP {status}: {body[:300]}")
        self.status = status


class Api:
    """aiohttp against the local API server as admin: bulk creates, lists and watches without the
    kubernetes client's per-call overhead (the benchmarks create thousands of objects)."""

    def __init__(self, cluster: LocalCluster, connections: int = 32):
        self.cluster = cluster
        self.base = cluster.apiserver_url
        self.connections = connections
        self._session: Any = None

    async def __aenter__(self) -> Api:
        import aiohttp

        conn = aiohttp.TCPConnector(ssl=self.cluster.ssl_context(), limit=self.connections)
        self._session = aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None, sock_read=None))
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        ok: Sequence[int] = (200, 201, 202),
    ) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        async with self._session.request(
            method, self.base + path, data=data, params=params, headers={"Content-Type": content_type}
        ) as resp:
            text = await resp.read()
            if resp.status not in ok:
                raise ApiError(resp.status, text.decode(errors="replace"), f"{method} {path}")
            return json.loads(text) if text else None

    async def create(self, path: str, obj: Mapping[str, Any], retries: int = 5) -> Any:
        """POST with retries on 429/5xx/connection errors (the API server sheds load under bulk creates)."""
        for attempt in range(retries + 1):
            try:
                return await self.request("POST", path, obj)
            except ApiError as exc:
                if exc.status == 409 or attempt == retries or not (exc.status == 429 or exc.status >= 500):
                    raise
            except OSError:
                if attempt == retries:
                    raise
            await asyncio.sleep(0.2 * 2**attempt)
        return None  # pragma: no cover

    async def create_many(
        self,
        path: str,
        objs: Iterable[Mapping[str, Any]],
        parallel: int = 32,
        on_created: Callable[[Mapping[str, Any], Any], None] | None = None,
    ) -> None:
        sem = asyncio.Semaphore(parallel)

        async def one(o: Mapping[str, Any]) -> None:
            async with sem:
                r = await self.create(path, o)
                if on_created:
                    on_created(o, r)

        await asyncio.gather(*(one(o) for o in objs))

    async def list(self, path: str, params: Mapping[str, str] | None = None) -> tuple[list[dict], str]:
        items: list[dict] = []
        p = dict(params or {}, limit="1000")
        while True:
            r = await self.request("GET", path, params=p)
            items.extend(r.get("items") or [])
            cont = r.get("metadata", {}).get("continue")
            if not cont:
                return items, r["metadata"]["resourceVersion"]
            p["continue"] = cont

    async def watch(
        self, path: str, resource_version: str, params: Mapping[str, str] | None = None, timeout_s: int = 3600
    ) -> AsyncIterator[tuple[str, dict]]:
        p = dict(
            params or {},
            watch="1",
            resourceVersion=resource_version,
            timeoutSeconds=str(timeout_s),
            allowWatchBookmarks="true",
        )
        async with self._session.get(self.base + path, params=p) as resp:
            if resp.status != 200:
                raise ApiError(resp.status, (await resp.read()).decode(errors="replace"), f"WATCH {path}")
            buf = b""
            async for chunk in resp.content.iter_any():
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        ev = json.loads(line)
                        yield ev["type"], ev["object"]

    async def delete_collection(self, path: str, params: Mapping[str, str] | None = None) -> None:
        await self.request("DELETE", path, params=dict(params or {}, gracePeriodSeconds="0"), ok=(200, 202, 404))


NOT_READY_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})
"""Taints kube-controller-manager puts on nodes that are (or were, at creation) not Ready."""


def create_nodes(
    cluster: LocalCluster, nodes: Sequence[Mapping[str, Any]], parallel: int = 16, ready_timeout: float = 600
) -> float:
    """Create kwok nodes (status included, so capacity is there before kwok marks them Ready) and wait
    until every one is Ready and schedulable (no not-ready taint). Returns the seconds it took."""
    t0 = time.monotonic()
    names = {n["metadata"]["name"] for n in nodes}

    async def go() -> None:
        async with Api(cluster, connections=parallel) as api:

            async def one(n: Mapping[str, Any]) -> None:
                try:
                    await api.create("/api/v1/nodes", n)
                except ApiError as exc:
                    if exc.status != 409:
                        raise
                # Node create drops status on some versions: make sure capacity is set.
                await api.request(
                    "PATCH",
                    f"/api/v1/nodes/{n['metadata']['name']}/status",
                    {"status": n["status"]},
                    content_type="application/merge-patch+json",
                )

            sem = asyncio.Semaphore(parallel)

            async def guarded(n: Mapping[str, Any]) -> None:
                async with sem:
                    await one(n)

            await asyncio.gather(*(guarded(n) for n in nodes))

            deadline = time.monotonic() + ready_timeout
            while True:
                items, _ = await api.list("/api/v1/nodes")
                # Ready, and the node lifecycle controller has lifted its not-ready taint: until then
                # kube-scheduler filters the node out, and a benchmark would run on a fraction of them.
                ready = {
                    i["metadata"]["name"]
                    for i in items
                    if any(
                        c.get("type") == "Ready" and c.get("status") == "True"
                        for c in (i.get("status") or {}).get("conditions") or []
                    )
                    and not any(t.get("key") in NOT_READY_TAINTS for t in (i.get("spec") or {}).get("taints") or [])
                }
                if names <= ready:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{len(names - ready)} of {len(names)} nodes not Ready (or still tainted not-ready) "
                        f"after {ready_timeout:.0f}s (is kwok running? {cluster.log_dir / 'kwok.log'})"
                    )
                await asyncio.sleep(0.5)

    asyncio.run(go())
    return time.monotonic() - t0


def delete_nodes(cluster: LocalCluster, label_selector: str) -> None:
    async def go() -> None:
        async with Api(cluster) as api:
            await api.delete_collection("/api/v1/nodes", {"labelSelector": label_selector})

    asyncio.run(go())


def ensure_namespace(cluster: LocalCluster, namespace: str, timeout: float = 60) -> None:
    cluster.kubectl("create", "namespace", namespace, check=False)
    wait_for(
        lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", namespace, check=False).returncode == 0,
        timeout,
        f"namespace {namespace}'s default ServiceAccount",
    )


# -- the stack ---------------------------------------------------------------------------------------


@dataclass
class Stack:
    """Extender + our kube-scheduler (+ operator, load exporter) on one local cluster."""

    cluster: LocalCluster
    extender: Extender = field(init=False)
    scheduler: KubeScheduler = field(init=False)
    operator: Operator = field(init=False)
    exporter: LoadExporter = field(init=False)

    def __post_init__(self) -> None:
        self.extender = Extender(self.cluster)
        self.scheduler = KubeScheduler(self.cluster)
        self.operator = Operator(self.cluster)
        self.exporter = LoadExporter(self.cluster)

    @property
    def info_path(self) -> Path:
        return self.cluster.stack_dir / "stack.json"

    def save(self, **extra: Any) -> None:
        info = {
            "extender": {"port": self.extender.port, "statusPort": self.extender.status_port},
            "scheduler": {"port": self.scheduler.port},
            "exporter": {"port": self.exporter.port},
            **extra,
        }
        self.cluster.stack_dir.mkdir(parents=True, exist_ok=True)
        self.info_path.write_text(json.dumps(info, indent=2))

    @classmethod
    def load(cls, cluster: LocalCluster) -> Stack:
        s = cls(cluster)
        try:
            info = json.loads(s.info_path.read_text())
        except (OSError, ValueError):
            return s
        s.extender.port = info.get("extender", {}).get("port")
        s.extender.status_port = info.get("extender", {}).get("statusPort")
        token = cluster.stack_dir / "tokens" / f"{STACK_IDENTITY}.token"
        s.extender.token_path = token if token.exists() else None
        s.scheduler.port = info.get("scheduler", {}).get("port")
        s.exporter.port = info.get("exporter", {}).get("port")
        s.info = info  # type: ignore[attr-defined]
        return s

    def up(
        self,
        model: str | Path | None = "auto",
        operator_namespace: str | None = None,
        load_exporter: bool = False,
        exporter_selector: str | None = None,
        leader_elect: bool = True,
        extender_settings: Mapping[str, Any] | None = None,
        scheduler_qps: float | None = None,
        scheduler_burst: int | None = None,
    ) -> None:
        """Start what is not running yet: load exporter, extender, operator, our kube-scheduler."""
        c = self.cluster
        c.stack_dir.mkdir(parents=True, exist_ok=True)
        if model == "auto":
            model = bundled_model()
        prom = c.prometheus_url
        if load_exporter and not self.exporter.alive():
            self.exporter.start_with(node_selector=exporter_selector)
            log(
                f"load exporter: pid {self.exporter.pid}, {self.exporter.url}"
                + (f", registered in {c.prometheus_targets_dir}" if prom else " (no Prometheus: not registered)")
            )
        policy_dir = c.stack_dir / "policy"
        policy_file = None
        if operator_namespace:
            policy_dir.mkdir(parents=True, exist_ok=True)
            policy_file = policy_dir / "policy.yaml"
            if not policy_file.exists():
                policy_file.write_text("{}\n")
        if not self.extender.alive():
            settings: dict[str, Any] = {"policyPollS": 1.0}
            if prom:
                settings["prometheus"] = {"intervalS": 5.0, "queries": local_load_queries()}
            settings.update(extender_settings or {})
            self.extender.start_with(model=model, policy_file=policy_file, prometheus_url=prom, settings=settings)
            log(f"extender: pid {self.extender.pid}, verbs {self.extender.url}, status {self.extender.status_url}")
        if operator_namespace and not self.operator.alive():
            ensure_namespace(c, operator_namespace)
            self.operator.start_with(
                operator_namespace,
                self.extender.status_url,
                policy_dir,
                decision_log=c.stack_dir / "decisions",
                prometheus_url=prom,
            )
            log(f"operator: pid {self.operator.pid}, watching namespace {operator_namespace}")
        if not self.scheduler.alive():
            conf = rl_scheduler_config(
                c, self.extender.url, leader_elect=leader_elect, qps=scheduler_qps, burst=scheduler_burst
            )
            self.scheduler.start_with(conf)
            log(
                f"kube-scheduler (profile {SCHEDULER_NAME}, lease {LEASE_NAMESPACE}/{LEASE_NAME}): "
                f"pid {self.scheduler.pid}, "
                f"https://127.0.0.1:{self.scheduler.port}"
            )
        self.save(model=str(model) if model else None, operatorNamespace=operator_namespace)

    def down(self) -> None:
        for p in (self.scheduler, self.operator, self.extender, self.exporter):
            if p.alive():
                p.stop()
                log(f"{p.name}: stopped")
            else:
                p.stop()  # clears stale pid files
        self.info_path.unlink(missing_ok=True)

    def status_lines(self) -> list[str]:
        lines = []
        for p in (self.scheduler, self.extender, self.operator, self.exporter):
            lines.append(f"{p.name:24s} {'running' if p.alive() else 'stopped':8s} {p.pid or '-':>8} {p.log_path}")
        if self.extender.alive():
            try:
                lines.append(f"policy: {describe_policy(self.extender.status())}")
            except Exception as exc:  # noqa: BLE001
                lines.append(f"policy: /status unavailable ({exc})")
        return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hack/rlstack.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster-dir", help="local-cluster state folder (default $RLSCHED_CLUSTER_DIR or .cache/cluster)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start the extender, our kube-scheduler (and operator, load exporter)")
    up.add_argument("--model", default="auto", help="model file, 'auto' (the bundled one if installed) or 'none'")
    up.add_argument("--operator", metavar="NAMESPACE", help="run the operator serving NAMESPACE/default")
    up.add_argument(
        "--load-exporter", action="store_true", help="run hack/load_exporter.py and register it with Prometheus"
    )
    up.add_argument("--exporter-selector", help="label selector of the nodes the exporter covers")
    up.add_argument("--no-leader-elect", action="store_true", help="no lease (one replica)")
    up.add_argument(
        "--explain-load",
        action="store_true",
        help="the extender's explainLoad: record, per decision, the node it picks with load unknown",
    )
    sub.add_parser("down", help="stop what up started")
    sub.add_parser("status", help="what runs")
    args = ap.parse_args(argv)
    cluster = LocalCluster.from_env(args.cluster_dir)
    if args.cmd == "up":
        cluster.ports()  # fails with a clear message without a cluster
        stack = Stack.load(cluster)
        model = None if args.model == "none" else args.model
        stack.up(
            model=model,
            operator_namespace=args.operator,
            load_exporter=args.load_exporter,
            exporter_selector=args.exporter_selector,
            leader_elect=not args.no_leader_elect,
            extender_settings={"explainLoad": True} if args.explain_load else None,
        )
        print("\n".join(stack.status_lines()))
    elif args.cmd == "down":
        Stack.load(cluster).down()
    else:
        print("\n".join(Stack.load(cluster).status_lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
