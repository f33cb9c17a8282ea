"""A background process of the stack with pid, start-time, executable and command files under ``<state>/run/``
and a log under ``<state>/logs/``, so that ``down`` (or anyone reading the pid file) stops exactly what was
started, and never a process that got the pid after ours ended."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from .cluster import LocalCluster
from .common import (
    PidRecord,
    log,
    port_in_use,
    process_running,
    process_start_time,
    recorded_process_alive,
    wait_for,
)

PID_FILES = ("pid", "start", "exe", "cmd")
"""``<state>/run/<name>.<ext>``: the pid, its start time (:func:`process_start_time`), argv[0] and the whole
command line. ``hack/local-cluster.sh`` writes the same files for its components and reads these ones."""


class Proc:
    """A background process with ``<state>/run/<name>.{pid,start,exe,cmd}`` and ``<state>/logs/<name>.log``,
    in its own session (process group). Stopping checks that the pid is still the process that was
    started (same start time, same executable): a pid the system gave to another process since is never
    signalled, and neither is one from a pid file without a start time (an older version's)."""

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
        record = self.record
        return record.pid if record else None

    @property
    def record(self) -> PidRecord | None:
        """The pid files as on disk (None without a readable pid file)."""
        return PidRecord.read(self.cluster.run_dir, self.name)

    def _child(self, pid: int) -> subprocess.Popen | None:
        """Our Popen when ``pid`` is the process this object started, else None."""
        return self.popen if self.popen is not None and self.popen.pid == pid else None

    def alive(self) -> bool:
        pid = self.pid
        if pid is None:
            return False
        child = self._child(pid)
        if child is not None:
            # Started by this process: the child's exit status is the truth. (The /proc check below is
            # for processes another invocation started; reading a busy child's cmdline can mislead.)
            return child.poll() is None
        return recorded_process_alive(self.cluster.run_dir, self.name)

    def start(self, argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: Path | None = None) -> None:
        if self.alive():
            raise RuntimeError(f"{self.name} already runs (pid {self.pid}); stop it first")
        record = self.record
        if record is not None and record.verdict() == "unverified":
            # Perhaps ours, started by an older version (no start time recorded): starting another
            # would leave two running and this one never stopped (hack/local-cluster.sh refuses too).
            raise RuntimeError(
                f"{self.name}: {self._file('pid')} names pid {record.pid}, which runs {record.exe}, but has no "
                f"start time (an older version wrote it), so it is not known to be ours. If it is "
                f"(ps -o pid,lstart,args -p {record.pid}), stop it yourself (kill -- -{record.pid}), then start again"
            )
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
        # The child is not reaped before we poll it, so /proc/PID/stat is there even if it died at once.
        started = process_start_time(self.popen.pid)
        self._file("start").write_text(f"{started if started is not None else ''}\n")
        self._file("exe").write_text(f"{argv[0]}\n")
        self._file("cmd").write_text(" ".join(map(str, argv)) + "\n")
        self._file("pid").write_text(f"{self.popen.pid}\n")  # last: readers find the others complete

    def _running(self, record: PidRecord) -> bool:
        child = self._child(record.pid)
        if child is not None:
            return child.poll() is None
        return process_running(record.pid, record.start_time)

    def signal(self, sig: int) -> None:
        if self.alive():
            os.killpg(self.pid, sig)  # type: ignore[arg-type]

    def kill(self) -> None:
        """SIGKILL, no grace (tests: a crash)."""
        record = self.record
        if record is not None and self.alive():
            os.killpg(record.pid, signal.SIGKILL)
            dying = record
            wait_for(lambda: not self._running(dying), 10, f"{self.name} to die", interval=0.05)
        self._reap()

    def stop(self, timeout: float = 15) -> None:
        record = self.record
        if record is not None and self.alive():
            self._terminate(record, timeout)
        elif record is not None:
            self._say_not_stopped(record)
        self._reap()
        for ext in PID_FILES:
            self._file(ext).unlink(missing_ok=True)

    def _terminate(self, record: PidRecord, timeout: float) -> None:
        """SIGTERM to the process group, SIGKILL after ``timeout`` seconds."""
        try:
            os.killpg(record.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + timeout
        while self._running(record) and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._running(record):
            log(f"{self.name}: pid {record.pid} ignored SIGTERM for {timeout:.0f}s; SIGKILL")
            try:
                os.killpg(record.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _say_not_stopped(self, record: PidRecord) -> None:
        """Why a pid file's pid that still runs is left alone (its files are removed all the same)."""
        verdict = record.verdict()
        if verdict == "unverified":
            log(
                f"{self.name}: NOT stopping pid {record.pid}: it runs {record.exe}, but {self._file('pid')} has no "
                f"start time (an older version wrote it), so it may be another process that got the pid. "
                f"If it is ours (ps -o pid,lstart,args -p {record.pid}), stop it yourself: kill -- -{record.pid}"
            )
        elif verdict == "reused":
            log(f"{self.name}: pid {record.pid} is another process now (ours has ended): not signalled")

    def _reap(self) -> None:
        if self.popen is not None:
            try:
                self.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def require_free_ports(self, *ports: int | None) -> None:
        """Fail before starting when one of ``ports`` is taken: otherwise whatever listens there answers
        the readiness check, and a process that could not bind looks ready."""
        for port in ports:
            if port is not None and port_in_use(port):
                raise RuntimeError(
                    f"{self.name}: port {port} is in use by another process (ss -ltnp 'sport = :{port}'); "
                    "stop that process, or remove the stack's state (hack/rlstack.py down) to get new ports"
                )

    def wait_ready(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait until ``ready()`` (a health check), then check that the process started is still alive
        (a check answered by another process on a port must not pass for ours). On failure a RuntimeError
        with the exit status and the log's tail."""
        try:
            wait_for(ready, timeout, f"{self.name} {what}", alive=self.alive)
        except AssertionError as exc:
            raise RuntimeError(self._failure(str(exc))) from None
        if not self.alive():
            raise RuntimeError(self._failure(f"{self.name} exited although {what} answered (another process?)"))

    def _failure(self, what: str) -> str:
        return f"{what}{self.exit_note()}\n--- {self.log_path} ---\n{self.tail()}"

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
