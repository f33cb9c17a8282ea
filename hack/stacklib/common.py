"""Names and small helpers every part of the local stack shares: the repository and tools folders, the
scheduler's name and lease, logging, pid records (is this pid still the process we started?), free
ports, polling, a plain HTTP GET."""

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_BIN = Path(os.environ.get("RLSCHED_TOOLS_BIN", REPO_ROOT / ".tools" / "bin"))
SCHEDULER_NAME = "rl-scheduler"
LEASE_NAME = "rl-scheduler"
LEASE_NAMESPACE = "kube-system"


def log(msg: str) -> None:
    print(f"[rlstack {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def proc_stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (``fields[0]`` is field 3, the state;
    ``fields[19]`` is field 22, the start time), or None when there is no such process. The name is
    cut at the *last* ``)``: it may itself hold spaces and parentheses (``python3 (x) y``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    _, sep, rest = stat.rpartition(b")")
    fields = rest.decode("ascii", errors="replace").split()
    return fields if sep and len(fields) >= 20 else None


def process_start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks after boot, field 22 of ``/proc/PID/stat``); None when there is no
    such process. A pid is reused once its process is gone; the pair (pid, start time) is not, so that is
    what a pid file records (``<name>.start`` beside ``<name>.pid``) to tell its process from a later one."""
    fields = proc_stat_fields(pid)
    return int(fields[19]) if fields is not None and fields[19].isdigit() else None


def process_running(pid: int, start_time: int | None) -> bool:
    """True while ``pid`` exists, is not a zombie and started at ``start_time`` (None never matches)."""
    fields = proc_stat_fields(pid)
    return fields is not None and fields[0] != "Z" and start_time is not None and fields[19] == str(start_time)


PidVerdict = Literal["ours", "gone", "reused", "unverified"]
"""What a pid file's pid is now. ``ours``: it runs, with the recorded start time and executable. ``gone``:
no pid file, or no such process (or a zombie). ``reused``: another process has the pid (another start
time, or another executable). ``unverified``: it runs the recorded executable, but the pid file has no
start time (written by an older version of these scripts), so it may as well be another process of the
same program that got the pid: never signalled."""


@dataclass(frozen=True)
class PidRecord:
    """``<run_dir>/<name>.{pid,start,exe}`` as written when the process was started."""

    pid: int
    start_time: int | None
    exe: str

    @classmethod
    def read(cls, run_dir: Path, name: str) -> PidRecord | None:
        try:
            pid = int((run_dir / f"{name}.pid").read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            start: int | None = int((run_dir / f"{name}.start").read_text().strip())
        except (OSError, ValueError):
            start = None
        try:
            exe = (run_dir / f"{name}.exe").read_text().strip()
        except OSError:
            exe = ""
        return cls(pid, start, exe)

    def verdict(self) -> PidVerdict:
        fields = proc_stat_fields(self.pid)
        if fields is None or fields[0] == "Z":
            return "gone"
        try:
            argv0 = Path(f"/proc/{self.pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            return "gone"
        if argv0 != self.exe:
            return "reused"
        if self.start_time is None:
            return "unverified"
        return "ours" if fields[19] == str(self.start_time) else "reused"


def recorded_process_alive(run_dir: Path, name: str) -> bool:
    """True while ``<run_dir>/<name>.pid`` names a live process (not a zombie) that started at the time in
    ``<name>.start`` and still runs the executable in ``<name>.exe`` — the check ``hack/local-cluster.sh``
    makes (its ``alive``): a pid file left behind, or a pid the system has given to another process since
    (even one of the same interpreter), does not count; nor does a pid file without a start time."""
    record = PidRecord.read(run_dir, name)
    return record is not None and record.verdict() == "ours"


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when something listens on ``host:port`` (a bind with ``SO_REUSEADDR``, as servers make it,
    fails; connections in TIME_WAIT do not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


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
