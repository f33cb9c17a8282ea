"""Pid files of the local stack (hack/stacklib, hack/local-cluster.sh): a pid is ours only with the start
time recorded beside it. A pid file left by a crash whose pid the system has given to another process of
the same interpreter (a notebook, a test's child) used to pass the only check (argv[0]), and ``down``
killed that process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from benchmark_scripts import load_hack_script

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "hack" / "local-cluster.sh"
rlstack = load_hack_script("rlstack")

from stacklib import common  # noqa: E402
from stacklib.process import Proc  # noqa: E402


def running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def victim() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated process of the same interpreter, in its own process group (a job started from a shell)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    time.sleep(0.3)  # exec'd: its cmdline is the interpreter's
    yield proc
    proc.kill()
    proc.wait()


def stale_pid_files(run: Path, name: str, pid: int, start: str | None) -> None:
    """What a crashed extender leaves: its pid (now the victim's), argv[0] and maybe a start time."""
    run.mkdir(parents=True, exist_ok=True)
    (run / f"{name}.pid").write_text(f"{pid}\n")
    (run / f"{name}.exe").write_text(f"{sys.executable}\n")
    if start is not None:
        (run / f"{name}.start").write_text(f"{start}\n")


@pytest.mark.parametrize("start", [None, "12345"], ids=["no-start-time", "other-start-time"])
def test_python_down_leaves_a_reused_pid_alone(
    tmp_path: Path, victim: subprocess.Popen[bytes], start: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    stale_pid_files(tmp_path / "run", "rlsched-extender", victim.pid, start)
    stack = rlstack.Stack.load(rlstack.LocalCluster(tmp_path))
    assert not stack.extender.alive()
    stack.down()
    time.sleep(0.2)
    assert victim.poll() is None, "down killed a process it did not start"
    assert not (tmp_path / "run" / "rlsched-extender.pid").exists()
    err = capsys.readouterr().err
    if start is None:
        assert f"NOT stopping pid {victim.pid}" in err and "no start time" in err
    else:
        assert f"pid {victim.pid} is another process now" in err


@pytest.mark.parametrize("start", [None, "12345"], ids=["no-start-time", "other-start-time"])
def test_shell_down_leaves_a_reused_pid_alone(
    tmp_path: Path, victim: subprocess.Popen[bytes], start: str | None
) -> None:
    stale_pid_files(tmp_path / "run", "rlsched-extender", victim.pid, start)
    done = subprocess.run(
        ["bash", str(SCRIPT), "down"],
        env=dict(os.environ, RLSCHED_CLUSTER_DIR=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    time.sleep(0.2)
    assert victim.poll() is None, f"down killed a process it did not start: {done.stderr}"
    assert not (tmp_path / "run" / "rlsched-extender.pid").exists()
    if start is None:
        assert f"NOT stopping pid {victim.pid}" in done.stderr


def test_a_started_process_is_recorded_with_its_start_time_and_stopped(tmp_path: Path) -> None:
    cluster = rlstack.LocalCluster(tmp_path)
    first = Proc(cluster, "sleeper")
    first.start(["sleep", "30"])
    later = Proc(cluster, "sleeper")  # another invocation: only the pid files to go by
    record = later.record
    assert record is not None and record.start_time == common.process_start_time(record.pid)
    seen = (record, common.proc_stat_fields(record.pid), Path(f"/proc/{record.pid}/cmdline").read_bytes())
    assert record.verdict() == "ours", seen  # once "not alive" on a loaded machine: say what it saw
    assert later.alive(), seen
    later.stop()
    assert not running(record.pid)
    assert not any((tmp_path / "run").iterdir())


def test_the_shell_and_python_sides_read_each_others_pid_files(tmp_path: Path) -> None:
    """``down`` (bash) stops what rlstack (Python) started, and rlstack sees what ``up`` (bash) started."""
    cluster = rlstack.LocalCluster(tmp_path)
    Proc(cluster, "py-started").start(["sleep", "30"])
    py_pid = Proc(cluster, "py-started").pid
    shell = (
        f"source {SCRIPT}; STATE={tmp_path}; RUN={tmp_path}/run; LOGS={tmp_path}/logs; "
        "port_of() { echo -; }; start sh-started sleep 30; alive sh-started && alive py-started && stop py-started"
    )
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert py_pid is not None and not running(py_pid)
    sh = Proc(cluster, "sh-started")
    try:
        assert sh.alive() and sh.record is not None and sh.record.verdict() == "ours"
    finally:
        sh.stop()


def test_the_start_time_is_read_after_the_last_parenthesis(tmp_path: Path) -> None:
    """The command name in /proc/PID/stat may hold spaces and ")": split on whitespace, every field after
    it moves. Both sides read field 22 after the name's last ")"."""
    name = "a) b (c"
    (tmp_path / name).symlink_to("/bin/sleep")
    proc = subprocess.Popen([str(tmp_path / name), "30"])
    try:
        time.sleep(0.2)
        stat = Path(f"/proc/{proc.pid}/stat").read_text()
        expected = int(stat.split(f"({name}) ", 1)[1].split()[19])
        assert common.process_start_time(proc.pid) == expected
        fields = common.proc_stat_fields(proc.pid)
        assert fields is not None and fields[0] in ("R", "S")
        shell = f"source {SCRIPT}; start_time {proc.pid}"
        done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=30)
        assert done.stdout.strip() == str(expected), done.stderr
    finally:
        proc.kill()
        proc.wait()


def test_a_gone_pid_has_no_start_time() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert common.process_start_time(gone.pid) is None
    assert not common.process_running(gone.pid, 1)


def test_start_refuses_over_a_pid_file_without_a_start_time(tmp_path: Path, victim: subprocess.Popen[bytes]) -> None:
    """An older version's pid file whose pid runs our interpreter may be our own process: starting another
    would leave two running (two operators on one namespace), the first never stopped."""
    stale_pid_files(tmp_path / "run", "rlsched-operator", victim.pid, None)
    proc = Proc(rlstack.LocalCluster(tmp_path), "rlsched-operator")
    with pytest.raises(RuntimeError, match="no start time"):
        proc.start([sys.executable, "-c", "import time; time.sleep(30)"])
    assert (tmp_path / "run" / "rlsched-operator.pid").read_text().strip() == str(victim.pid)
