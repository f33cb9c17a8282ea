"""Names and small helpers every part of the local stack shares: the repository and tools folders, the
scheduler's name and lease, logging, free ports, polling, a plain HTTP GET."""

from __future__ import annotations

import os
import socket
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_BIN = Path(os.environ.get("RLSCHED_TOOLS_BIN", REPO_ROOT / ".tools" / "bin"))
SCHEDULER_NAME = "rl-scheduler"
LEASE_NAME = "rl-scheduler"
LEASE_NAMESPACE = "kube-system"


def log(msg: str) -> None:
    print(f"[rlstack {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def recorded_process_alive(run_dir: Path, name: str) -> bool:
    """True while ``<run_dir>/<name>.pid`` names a live process (not a zombie) that still runs the executable
    in ``<name>.exe`` — the check ``hack/local-cluster.sh`` makes (its ``alive``): a pid file left behind,
    or a pid the system has given to another program since, does not count."""
    try:
        pid = int((run_dir / f"{name}.pid").read_text().strip())
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        exe = (run_dir / f"{name}.exe").read_text().strip()
    except (OSError, ValueError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z" and cmd == exe


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
