"""A background process of the stack with pid, executable and command files under ``<state>/run/`` and a log
under ``<state>/logs/``, so that ``down`` (or anyone reading the pid file) stops exactly what was started."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from .cluster import LocalCluster
from .common import log, recorded_process_alive, wait_for


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
        return recorded_process_alive(self.cluster.run_dir, self.name)

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
