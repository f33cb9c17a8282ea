"""hack/rlstack.py's Stack.up without a cluster: what it records in stack.json and when, which running
processes it keeps (same arguments, known ports) and which it restarts, and that it renews the tokens of
what it keeps; the token file's mode; LocalCluster.prometheus_url on a stale pid file."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def load_rlstack() -> Any:
    if "rlstack" not in sys.modules:
        spec = importlib.util.spec_from_file_location("rlstack", REPO_ROOT / "hack" / "rlstack.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules["rlstack"] = module
        spec.loader.exec_module(module)
    return sys.modules["rlstack"]


rlstack = load_rlstack()


class Harness:
    """A Stack whose processes are fakes: ``running`` per name, ``starts`` in order, ``tokens`` renewed."""

    def __init__(self, state: Path, monkeypatch: pytest.MonkeyPatch):
        self.state = state
        self.monkeypatch = monkeypatch
        self.running: dict[str, bool] = {}
        self.starts: list[str] = []
        self.stops: list[str] = []
        self.tokens: list[str] = []
        self.fail_on: str | None = None
        self.ports = iter(range(40000, 41000))
        monkeypatch.setattr(rlstack, "service_account_token", self.token)
        monkeypatch.setattr(rlstack, "ensure_namespace", lambda cluster, ns: None)
        monkeypatch.setattr(rlstack.LocalCluster, "apply", lambda self, objs, server_side=False: None)

    def token(self, cluster: Any, account: str, *a: Any, **k: Any) -> Path:
        self.tokens.append(account)
        return self.state / f"{account}.token"

    def stack(self, load: bool = True) -> Any:
        cluster = rlstack.LocalCluster(self.state)
        s = rlstack.Stack.load(cluster) if load else rlstack.Stack(cluster)
        for proc in (s.extender, s.scheduler, s.operator, s.exporter):
            self.fake(proc)
        return s

    def fake(self, proc: Any) -> None:
        h = self

        def alive() -> bool:
            return h.running.get(proc.name, False)

        def stop(timeout: float = 15) -> None:
            h.stops.append(proc.name)
            h.running[proc.name] = False

        def start_with(*args: Any, **kwargs: Any) -> None:
            if hasattr(proc, "status_port"):
                proc.port = kwargs.get("port") or proc.port or next(h.ports)
                proc.status_port = kwargs.get("status_port") or proc.status_port or next(h.ports)
            elif hasattr(proc, "port"):
                proc.port = kwargs.get("port") or next(h.ports)
            if isinstance(kwargs.get("settings"), dict):
                kwargs["settings"]["mutated"] = True  # what it does to its arguments is not what was asked
            h.running[proc.name] = True  # the process runs from here on, ready or not
            h.starts.append(proc.name)
            if h.fail_on == proc.name:
                raise KeyboardInterrupt  # Ctrl-C while it waits for /readyz

        proc.alive, proc.stop, proc.start_with = alive, stop, start_with


def up(s: Any, **kwargs: Any) -> None:
    s.up(**{"model": None, "operator_namespace": "demo", "load_exporter": True, **kwargs})


@pytest.fixture
def h(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Harness:
    (tmp_path / "ports.env").write_text("APISERVER_PORT=1\nPROMETHEUS_PORT=2\n")
    return Harness(tmp_path, monkeypatch)


def scheduler_url(h: Harness) -> str:
    conf = json.loads((h.state / "rlstack" / "stack.json").read_text())["scheduler"]["args"]["config"]
    return str(conf["extenders"][0]["urlPrefix"])


def test_an_interrupted_up_records_the_ports_of_what_it_started(h: Harness) -> None:
    h.fail_on = "rl-kube-scheduler"
    with pytest.raises(KeyboardInterrupt):
        up(h.stack())
    info = json.loads((h.state / "rlstack" / "stack.json").read_text())
    assert isinstance(info["extender"]["port"], int) and isinstance(info["extender"]["statusPort"], int)
    assert isinstance(info["exporter"]["port"], int) and info["operator"]["args"]["namespace"] == "demo"
    assert isinstance(info["scheduler"]["port"], int)
    # the next up keeps them, with their ports: the scheduler is pointed at a real address
    h.fail_on, h.starts = None, []
    s = h.stack()
    up(s)
    assert h.starts == [] and h.stops == []  # the scheduler too: recorded though cut short in its wait
    assert scheduler_url(h) == f"http://127.0.0.1:{info['extender']['port']}" == s.extender.url


@pytest.mark.parametrize("load", [True, False])
def test_a_running_extender_without_recorded_ports_is_restarted_not_reused(h: Harness, load: bool) -> None:
    h.running.update({"rlsched-extender": True, "rl-kube-scheduler": True})
    (h.state / "rlstack").mkdir()
    (h.state / "rlstack" / "stack.json").write_text(json.dumps({"extender": {}, "scheduler": {}}))
    s = h.stack(load)
    up(s, operator_namespace=None, load_exporter=False)
    assert h.stops == ["rlsched-extender", "rl-kube-scheduler"]
    assert h.starts == ["rlsched-extender", "rl-kube-scheduler"]
    assert "None" not in scheduler_url(h) and scheduler_url(h) == s.extender.url


def test_the_same_arguments_keep_everything_and_renew_the_tokens(h: Harness) -> None:
    up(h.stack())
    h.starts, h.tokens = [], []
    s = h.stack(load=False)  # as the e2e fixture makes it: the ports come from stack.json
    up(s)
    assert h.starts == [] and h.stops == []
    assert h.tokens == ["rlsched-stack", "rlsched-operator"]
    assert isinstance(s.extender.port, int) and isinstance(s.exporter.port, int)


def test_other_extender_arguments_restart_it_on_its_ports(h: Harness, capsys: pytest.CaptureFixture[str]) -> None:
    up(h.stack())
    before = json.loads((h.state / "rlstack" / "stack.json").read_text())["extender"]
    h.starts = []
    up(h.stack(), extender_settings={"explainLoad": True})
    assert h.stops == ["rlsched-extender"] and h.starts == ["rlsched-extender"]
    after = json.loads((h.state / "rlstack" / "stack.json").read_text())["extender"]
    assert (after["port"], after["statusPort"]) == (before["port"], before["statusPort"])
    assert after["args"]["settings"]["explainLoad"] is True
    assert "runs with other arguments (settings): restarting it" in capsys.readouterr().err
    # another model too; the scheduler and operator (same extender address) stay
    h.starts, h.stops = [], []
    up(h.stack(), model="/models/other.npz", extender_settings={"explainLoad": True})
    assert h.starts == ["rlsched-extender"] and h.stops == ["rlsched-extender"]


def test_up_without_operator_keeps_the_running_one(h: Harness) -> None:
    up(h.stack())
    h.starts = []
    up(h.stack(), operator_namespace=None, load_exporter=False)
    assert h.starts == [] and h.stops == []
    assert json.loads((h.state / "rlstack" / "stack.json").read_text())["operatorNamespace"] == "demo"


def test_another_operator_namespace_restarts_the_operator(h: Harness) -> None:
    up(h.stack())
    h.starts = []
    up(h.stack(), operator_namespace="other")
    assert h.starts == ["rlsched-operator"] and h.stops == ["rlsched-operator"]


# -- tokens, Prometheus ------------------------------------------------------------------------------


class TokenCluster:
    def __init__(self, stack_dir: Path):
        self.stack_dir = stack_dir
        self.calls: list[tuple[str, ...]] = []

    def apply(self, objs: Any) -> None:
        pass

    def kubectl(self, *args: str) -> Any:
        self.calls.append(args)
        return subprocess.CompletedProcess(args, 0, stdout="tok-" + str(len(self.calls)) + "\n", stderr="")


def test_the_token_file_is_never_readable_by_others(tmp_path: Path) -> None:
    from stacklib.identity import service_account_token

    c = TokenCluster(tmp_path)
    (tmp_path / "tokens").mkdir()
    leftover = tmp_path / "tokens" / ".rlsched-stack.token.tmp"
    leftover.write_text("old")
    leftover.chmod(0o644)  # an interrupted write, before this fix
    old = os.umask(0o022)
    try:
        path = service_account_token(c, "rlsched-stack")  # type: ignore[arg-type]
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text() == "tok-1\n"
    assert not leftover.exists()
    assert c.calls[0][-2:] == ("--duration", rlstack.TOKEN_DURATION)


def test_prometheus_url_needs_a_live_prometheus_not_a_pid_file(tmp_path: Path) -> None:
    (tmp_path / "ports.env").write_text("PROMETHEUS_PORT=19191\n")
    run = tmp_path / "run"
    run.mkdir()
    cluster = rlstack.LocalCluster(tmp_path)
    assert cluster.prometheus_url is None
    gone = subprocess.Popen(["sleep", "0"])
    gone.wait()
    (run / "prometheus.pid").write_text(f"{gone.pid}\n")  # left behind by a Prometheus that died
    (run / "prometheus.exe").write_text("sleep\n")
    assert cluster.prometheus_url is None
    live = subprocess.Popen(["sleep", "30"])
    try:
        from stacklib.common import process_start_time

        (run / "prometheus.pid").write_text(f"{live.pid}\n")
        assert cluster.prometheus_url is None  # no start time recorded: not known to be ours
        (run / "prometheus.start").write_text(f"{process_start_time(live.pid)}\n")
        assert cluster.prometheus_url == "http://127.0.0.1:19191"
        (run / "prometheus.exe").write_text("/usr/bin/prometheus\n")  # the pid now runs something else
        assert cluster.prometheus_url is None
    finally:
        live.kill()
        live.wait()
