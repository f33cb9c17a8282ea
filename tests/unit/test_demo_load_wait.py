"""hack/demo.py waits for the extender's first fresh node load, and says so plainly when it gives up."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def load_demo() -> Any:
    spec = importlib.util.spec_from_file_location("rlsched_demo", REPO_ROOT / "hack" / "demo.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("rlsched_demo", module)
    spec.loader.exec_module(module)
    return module


def columns(fresh: int, configured: bool = True, error: str | None = None) -> dict[str, dict]:
    return {
        k: {"configured": configured, "freshNodes": fresh, "missingNodes": 8 - fresh, "lastError": error}
        for k in ("cpu", "memory", "network", "disk")
    }


class FakeProc:
    def __init__(self, answers: list[dict | None], published: dict | None = None):
        self.answers = answers
        self.published = published or {}

    def alive(self) -> bool:
        return True

    def status(self) -> dict:
        cols = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return {} if cols is None else {"load": {"columns": cols}}

    def loads(self) -> dict:
        return self.published


class FakeStack:
    def __init__(self, answers: list[dict | None], published: dict | None = None):
        self.extender = FakeProc(answers)
        self.exporter = FakeProc([None], published)


@pytest.fixture
def demo(monkeypatch: pytest.MonkeyPatch) -> Any:
    module = load_demo()
    monkeypatch.setattr(module.time, "sleep", lambda _s: None)
    return module


def test_waits_until_every_demo_node_is_fresh(demo: Any, capsys: pytest.CaptureFixture[str]) -> None:
    stack = FakeStack([columns(0), columns(0), columns(3), columns(8)], {"demo-t4-0": {"cpu": 0.1}})
    out = demo.wait_for_load(stack, 90)
    assert out.known and out.columns["cpu"]["freshNodes"] == 8
    assert out.published == {"demo-t4-0": {"cpu": 0.1}}
    err = capsys.readouterr().err
    assert "cpu 3/8" in err and "node load known after" in err


def test_says_plainly_when_load_is_not_known(demo: Any, capsys: pytest.CaptureFixture[str]) -> None:
    out = demo.wait_for_load(FakeStack([columns(0, error="connection refused")]), 0)
    assert not out.known and out.why.startswith("not known yet")
    err = capsys.readouterr().err
    assert "WITHOUT node load" in err and "connection refused" in err


def test_partial_load_is_reported_as_partial(demo: Any, capsys: pytest.CaptureFixture[str]) -> None:
    out = demo.wait_for_load(FakeStack([columns(5)]), 0)
    assert not out.known and "in part" in out.why and "cpu 5/8" in out.why
    assert "placed with what is known" in capsys.readouterr().err


def test_no_prometheus_is_said_too(demo: Any, capsys: pytest.CaptureFixture[str]) -> None:
    out = demo.wait_for_load(FakeStack([None]), 90)
    assert out.columns is None and not out.known
    assert "reads no Prometheus" in capsys.readouterr().err


def test_fresh_load_waits_for_a_full_rate_window(demo: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    """Every node fresh is not enough while the series are younger than the rate window: young rates
    read wrong (docs/e2e.md). The demo waits until ``settled_at``, logging it once."""
    clock = iter(float(t) for t in range(1000))
    monkeypatch.setattr(demo.time, "monotonic", lambda: next(clock))
    out = demo.wait_for_load(FakeStack([columns(8)]), 90, settled_at=6.0)
    assert out.known and out.waited_s >= 5
    assert capsys.readouterr().err.count("waiting for their rates to span a whole window") == 1
    # past the limit, fresh but young load is used as it is
    clock = iter(float(t) for t in range(1000))
    assert demo.wait_for_load(FakeStack([columns(8)]), 3, settled_at=500.0).known


def test_the_report_lists_the_placements_load_changed(demo: Any, capsys: pytest.CaptureFixture[str]) -> None:
    records = {
        "train": {"node": "demo-v100-1", "withoutLoad": {"node": "demo-v100-0", "changed": True}},
        "infer": {"node": "demo-a100-0", "withoutLoad": {"node": "demo-a100-0", "changed": False}},
        "etl": {"node": "demo-t4-0"},  # decided while load was unknown: not explained
    }
    wait = demo.LoadWait(columns(8), 10.0, True)
    wait.published = {"demo-v100-0": {"cpu": 0.95}, "demo-v100-1": {"cpu": 0.1}}
    demo.report_load_choices(records, wait)
    out = capsys.readouterr().out
    assert "1 of 2 placements" in out
    assert "train -> demo-v100-1 (cpu 10 %); with load unknown it would have gone to demo-v100-0 (cpu 95 %)" in out
    assert "infer ->" not in out
    demo.report_load_choices({"infer": records["infer"]}, wait)
    assert "Load did not change any of these choices" in capsys.readouterr().out
    demo.report_load_choices({"etl": records["etl"]}, wait)
    assert "No placement was explained" in capsys.readouterr().out


class RefusingExtender(FakeProc):
    """An extender whose /status refuses the token (an expired ``kubectl create token``)."""

    token_path = Path("/state/rlstack/tokens/rlsched-stack.token")

    def status(self) -> dict:
        raise demo_module().rlstack.StatusHttpError("rlsched-extender /status: HTTP 401: b'Unauthorized'", 401)


def demo_module() -> Any:
    return sys.modules["rlsched_demo"]


def test_a_refused_token_is_said_plainly_not_as_a_traceback(
    demo: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    stack = FakeStack([None])
    stack.extender = RefusingExtender([None])
    stack.scheduler = FakeProc([None])  # type: ignore[attr-defined]
    monkeypatch.setattr(demo.rlstack.Stack, "load", classmethod(lambda cls, cluster: stack))
    monkeypatch.setattr(demo.rlstack, "create_nodes", lambda *a, **k: pytest.fail("went on after the 401"))
    assert demo.main() == 1
    err = capsys.readouterr().err
    assert "HTTP 401" in err and "refused the stack's token" in err and "hack/demo.sh again" in err
    assert "rlsched-stack.token" in err
    # while waiting for load (the token expiring mid-run): no traceback, the pods go without load
    out = demo.wait_for_load(stack, 90)
    assert out.columns is None and not out.known and "HTTP 401" in out.why
