"""hack/load_exporter.py on input it cannot trust: pods' usage annotations (anyone may write one), its
arguments, ``PUT /loads/<node>`` and a refresh that keeps failing."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import threading
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from benchmark_scripts import load_hack_script

USAGE = "rlsched.io/usage"
GOOD = {"cpu": 0.5, "mem": 0.5, "gpu": 0.5, "cpuStd": 0.1, "memStd": 0.1, "gpuStd": 0.1, "cpuMax": 2.0}
GOOD |= {"memMax": 1.0, "gpuMilli": 1000, "ls": True}


@pytest.fixture(scope="module")
def le() -> ModuleType:
    return load_hack_script("load_exporter")


def node(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "status": {"allocatable": {"cpu": "32", "memory": "64Gi", "nvidia.com/gpu": "8"}},
    }


def pod(name: str, on: str, annotation: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name, "annotations": {USAGE: annotation}},
        "spec": {"nodeName": on, "containers": [{"resources": {"requests": {"cpu": "4", "memory": "8Gi"}}}]},
    }


def exporter(le: ModuleType, usage_mode: bool = True, refresh: float = 1.0) -> Any:
    args = argparse.Namespace(usage_annotations=usage_mode, usage_seed=0, targets_dir=None, port=9101, refresh=refresh)
    return le.Exporter(args)


async def get(exp: Any, path: str) -> tuple[int, str]:
    from aiohttp.test_utils import TestClient, TestServer

    async with TestClient(TestServer(exp.app())) as client:
        r = await client.get(path)
        return r.status, await r.text()


def no_constant(name: str) -> float:
    raise AssertionError(f"/loads is not JSON: it holds {name}")


BAD = [
    '{"cpu": "high"}',
    '{"cpu": NaN, "cpuStd": 0.1, "cpuMax": 2}',
    '{"cpu": 0.5, "cpuMax": Infinity}',
    '{"mem": -0.5, "memMax": 1}',
    '{"gpu": 0.5, "gpuStd": 1e300, "gpuMilli": 1000}',
    '{"cpu": true}',
    '{"gpuMilli": "1000", "gpu": 0.5}',
    '{"gpuMilli": 1e400}',
    "not json",
    "[1, 2]",
]


def test_a_bad_usage_annotation_skips_only_its_pod(le: ModuleType, caplog: pytest.LogCaptureFixture) -> None:
    """One pod's bad annotation used to make the whole refresh raise: every node's usage stayed frozen
    while /healthz said ok. Now that pod counts as idle, is logged once and counted, the rest applies."""
    nodes = [node("a"), node("b")]
    good = [pod("g1", "a", json.dumps(GOOD)), pod("g2", "b", json.dumps(GOOD))]
    bad = [pod(f"bad{i}", "ab"[i % 2], text) for i, text in enumerate(BAD)]
    exp = exporter(le)
    with caplog.at_level(logging.WARNING, logger="load_exporter"):
        exp.apply(nodes, good + bad)
        exp.apply(nodes, good + bad)  # the same bad pods again: not logged again
    assert exp.refreshes == 2
    # what the good pods alone give, with the exporter's seed: the bad pods drew nothing
    ref = np.random.default_rng(0)
    le.usage_per_node(nodes, good, ref)
    expected = le.usage_per_node(nodes, good, ref)
    for n in "ab":
        assert exp.nodes[n].gauges == pytest.approx(expected[n])
    assert set(exp.skipped) == {f"ns/bad{i}" for i in range(len(BAD))}
    warnings = [r.getMessage() for r in caplog.records if "usage annotation skipped" in r.getMessage()]
    assert len(warnings) == len(BAD)
    assert any("ns/bad0" in w and "cpu is not a number" in w for w in warnings)
    _, metrics = asyncio.run(get(exp, "/metrics"))
    assert f"rlsched_load_exporter_skipped_pods {len(BAD)}" in metrics
    assert f"rlsched_load_exporter_invalid_usage_annotations_total {len(BAD)}" in metrics
    exp.apply(nodes, good)  # the bad pods are gone
    _, metrics = asyncio.run(get(exp, "/metrics"))
    assert "rlsched_load_exporter_skipped_pods 0" in metrics


@pytest.mark.parametrize("text", [BAD[1], BAD[2], BAD[4]])
def test_non_finite_usage_never_reaches_the_published_series(le: ModuleType, text: str) -> None:
    """A ``NaN`` annotation used to publish ``nan`` gauges, ``NaN`` on /loads (not JSON) and left the
    node's ``node_cpu_seconds_total`` counters ``nan`` for good, even after the pod was gone."""
    nodes = [node("a")]
    good = pod("g", "a", json.dumps(GOOD))
    exp = exporter(le)
    exp.apply(nodes, [good])
    exp.apply(nodes, [good, pod("bad", "a", text)])
    status, page = asyncio.run(get(exp, "/nodes/a/metrics"))
    assert status == 200
    values = [line.rsplit(" ", 1)[1] for line in page.splitlines() if line and not line.startswith("#")]
    assert values and all(math.isfinite(float(v)) for v in values), page
    _, loads = asyncio.run(get(exp, "/loads"))
    json.loads(loads, parse_constant=no_constant)
    exp.apply(nodes, [good])
    assert all(math.isfinite(v) for v in exp.nodes["a"].counters.values())


def healthz_before_and_after(
    exp: Any, meanwhile: Callable[[], Awaitable[None]], then: Callable[[], Any] = lambda: None
) -> tuple[tuple[int, str], tuple[int, str]]:
    """``/healthz`` after the refresh loop's first good refresh, and again once ``meanwhile`` returns;
    ``then`` runs before the loop is cancelled."""

    async def run() -> tuple[tuple[int, str], tuple[int, str]]:
        task = asyncio.create_task(exp.loop())
        while exp.refreshes == 0:
            await asyncio.sleep(0.001)
        first = await get(exp, "/healthz")
        await meanwhile()
        later = await get(exp, "/healthz")
        then()
        task.cancel()
        return first, later

    return asyncio.run(run())


def test_healthz_says_when_the_refresh_keeps_failing(le: ModuleType) -> None:
    """After a first good refresh /healthz used to say ok for ever, however many refreshes failed since."""
    exp = exporter(le, usage_mode=False, refresh=0.001)
    calls = {"n": 0}

    def fetch() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        calls["n"] += 1
        if calls["n"] == 1:
            return [node("a")], []
        raise ConnectionError("the API server is gone")

    exp.fetch = fetch

    async def five_failures() -> None:
        while exp.errors < 5:
            await asyncio.sleep(0.001)

    first, later = healthz_before_and_after(exp, five_failures)
    assert first[0] == 200
    assert later[0] == 503 and "the API server is gone" in later[1]


def test_pins_are_capped_and_can_be_removed(le: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """``PUT /loads/<anything>`` used to grow the pins without bound. A pin may still name a node not
    listed yet (the tests pin right after creating one), up to ``MAX_PINS``; ``{}`` frees a slot."""
    from aiohttp.test_utils import TestClient, TestServer

    monkeypatch.setattr(le, "MAX_PINS", 3, raising=False)
    exp = exporter(le, usage_mode=False)
    exp.apply([node("a")], [])

    async def go() -> list[int]:
        async with TestClient(TestServer(exp.app())) as client:
            codes = []
            for name in ("a", "later-1", "later-2", "ghost", "a"):
                codes.append((await client.put(f"/loads/{name}", json={"cpu": 0.5})).status)
            codes.append((await client.put("/loads/later-2", json={})).status)
            codes.append((await client.put("/loads/ghost", json={"cpu": 0.5})).status)
            return codes

    assert asyncio.run(go()) == [200, 200, 200, 409, 200, 200, 200]
    assert set(exp.pins) == {"a", "later-1", "ghost"}
    exp.apply([node("a"), node("later-1")], [])
    assert exp.nodes["later-1"].value("cpu") == 0.5


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--refresh", "nan"], "--refresh"),
        (["--refresh", "0"], "--refresh"),
        (["--refresh", "-5"], "--refresh"),
        (["--refresh", "inf"], "--refresh"),
        (["--port", "70000"], "--port"),
        (["--port", "0"], "--port"),
        (["--usage-seed", "-1"], "--usage-seed"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(
    le: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], flag: str
) -> None:
    """NaN refresh never slept out, 0 or less listed the API server in a tight loop, a port past 65535 or a
    negative seed failed later with a traceback: now argparse refuses them before anything starts."""

    async def started(args: argparse.Namespace) -> None:
        raise AssertionError(f"started with {args}")

    monkeypatch.setattr(le, "amain", started)
    with pytest.raises(SystemExit) as exc:
        le.main(["--kubeconfig", "kubeconfig", *argv])
    assert exc.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and f"argument {flag}:" in errors[0]


class RecordingApi:
    """The kubernetes client's CoreV1Api as far as ``fetch`` uses it, keeping the keyword arguments."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def _list(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        return argparse.Namespace(data=json.dumps({"items": []}).encode())

    list_node = list_pod_for_all_namespaces = _list


def test_every_list_has_a_request_timeout(le: ModuleType) -> None:
    """Without ``_request_timeout`` an API server that stops answering blocked the refresh for ever."""
    exp = exporter(le, usage_mode=False)
    exp.args.node_selector = None
    exp.api = RecordingApi()
    assert exp.fetch() == ([], [])
    assert len(exp.api.calls) == 2
    assert all(0 < call.get("_request_timeout", 0) <= 60 for call in exp.api.calls), exp.api.calls


def test_healthz_says_when_a_refresh_hangs(le: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """A list that never returns is no failed refresh: /healthz said ok for ever, serving the first values.
    Now it says 503 once the last good refresh is older than ``stale_after_s``."""
    monkeypatch.setattr(le, "REQUEST_TIMEOUT_S", 0.05, raising=False)
    exp = exporter(le, usage_mode=False, refresh=0.01)
    release = threading.Event()
    calls = {"n": 0}

    def fetch() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        calls["n"] += 1
        if calls["n"] > 1:
            release.wait(30)  # the API server stopped answering
        return [node("a")], []

    exp.fetch = fetch

    async def stalled() -> None:
        await asyncio.sleep(1.0)  # far past 3 × 0.01 + 2 × 0.05 s

    first, later = healthz_before_and_after(exp, stalled, then=release.set)
    assert first[0] == 200
    assert later[0] == 503 and "no successful refresh" in later[1]
