"""The rebalancer's kopf timer handler and the operator's /metrics listener, called directly."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import kopf
import pytest
from test_operator_rebalancer import NOW, Clock, FakeKube, fake_planner, node, pod

from rlsched.operator import handlers
from rlsched.operator.extender_client import ExtenderUnavailable
from rlsched.operator.metrics import make_app, parse_endpoint
from rlsched.operator.rebalancer import Metrics, Rebalancer
from rlsched.operator.settings import RebalancerSettings, SettingsError, load_settings


class Extender:
    def __init__(self, up: bool = True):
        self.up = up

    async def status(self) -> object:
        if not self.up:
            raise ExtenderUnavailable("GET /status: refused")
        return object()


def runtime(up: bool = True) -> tuple[Any, FakeKube, Clock]:
    kube = FakeKube([node("n0"), node("n1"), node("n2")], [pod("a", "n0", gpus=1)])
    clock = Clock()
    rb = Rebalancer(
        RebalancerSettings(), "rl-scheduler", kube, planner=fake_planner("team/a"), clock=clock, monotonic=clock
    )
    locks: dict[str, asyncio.Lock] = {}
    rt = SimpleNamespace(
        rebalancer=rb, extender=Extender(up), locks=locks, lock=lambda k: locks.setdefault(k, asyncio.Lock())
    )
    return rt, kube, clock


async def call(rt: Any, spec: dict, status: dict | None = None) -> kopf.Patch:
    memo = kopf.Memo()
    memo.runtime = rt
    patch = kopf.Patch()
    await handlers.rebalance(spec=spec, status=status or {}, patch=patch, memo=memo)
    return patch


ON = {"rebalance": {"enabled": True, "dryRun": False, "minPodAgeSeconds": 0, "intervalSeconds": 60}}


async def test_a_due_cycle_patches_the_status_and_waits_for_the_interval() -> None:
    rt, kube, clock = runtime()
    patch = await call(rt, ON)
    st = patch.status["rebalance"]
    assert st["outcome"] == "planned" and st["moves"][0]["result"] == "evicted" and len(kube.evictions) == 1
    assert st["recent"] == [{"at": NOW, "owner": "team/ReplicaSet/a-rs"}]
    clock.t += 30
    assert "rebalance" not in (await call(rt, ON)).status  # not due yet
    clock.t += 30
    assert "rebalance" in (await call(rt, ON)).status


@pytest.mark.parametrize("previous", ["planned", ["x"], 7])
async def test_a_status_edited_into_another_shape_is_read_as_empty(previous: Any) -> None:
    rt, kube, _ = runtime()
    patch = await call(rt, ON, {"rebalance": previous})
    assert patch.status["rebalance"]["outcome"] == "planned" and len(kube.evictions) == 1


@pytest.mark.parametrize(
    "spec", [{}, {"rebalance": {"enabled": False}}, {"rebalance": {"enabled": True, "intervalSeconds": 1}}]
)
async def test_off_or_invalid_does_nothing(spec: dict) -> None:
    rt, kube, _ = runtime()
    patch = await call(rt, spec)
    assert "rebalance" not in patch.status and kube.lists == [] and kube.evictions == []


async def test_no_cycle_while_the_extender_is_down_or_a_rollout_runs() -> None:
    rt, kube, _ = runtime(up=False)
    patch = await call(rt, ON)
    assert (
        patch.status["rebalance"]["outcome"] == "skipped" and "does not answer" in patch.status["rebalance"]["message"]
    )
    assert kube.evictions == []
    rt2, kube2, _ = runtime()
    async with rt2.lock("policy-uid"):
        assert "rebalance" not in (await call(rt2, ON)).status
    assert kube2.lists == []


async def test_switching_it_off_says_so_once() -> None:
    rt, _, _ = runtime()
    off = {"rebalance": {"enabled": False}}
    patch = await call(rt, off, {"rebalance": {"outcome": "planned"}})
    assert patch.status["rebalance"]["outcome"] == "disabled"
    assert "rebalance" not in (await call(rt, off, {"rebalance": {"outcome": "disabled"}})).status


async def test_without_a_rebalancer_nothing_happens() -> None:
    rt = SimpleNamespace(rebalancer=None)
    assert "rebalance" not in (await call(rt, ON)).status


async def test_metrics_listener_serves_the_counters(aiohttp_client: Any) -> None:
    m = Metrics()
    m.evictions.labels(result="blocked_by_pdb").inc()
    client = await aiohttp_client(make_app(m.registry))
    resp = await client.get("/metrics")
    text = await resp.text()
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
    assert 'rlsched_operator_rebalance_evictions_total{result="blocked_by_pdb"} 1.0' in text
    assert 'rlsched_operator_rebalance_evictions_total{result="evicted"} 0.0' in text


def test_metrics_endpoint_setting() -> None:
    assert parse_endpoint("0.0.0.0:9102") == ("0.0.0.0", 9102) and parse_endpoint("[::]:80") == ("::", 80)
    assert load_settings(None, {"metricsEndpoint": "127.0.0.1:9102"}).metrics_endpoint == "127.0.0.1:9102"
    for bad in ("9102", "host:", "host:0", "host:99999", ":80"):
        with pytest.raises(SettingsError, match="metricsEndpoint"):
            load_settings(None, {"metricsEndpoint": bad})
