"""The real-stack dynamic replay's pure parts: the slice, the usage annotation, the exporter's usage
mode and the measures from pod timelines (rlsched.policy.dynamic.replay, hack/load_exporter.py,
hack/replay_dynamic.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from benchmark_scripts import load_hack_script

from rlsched.policy import NodeSpec, PodSpec, typical_pods
from rlsched.policy.dynamic.arrivals import ArrivalSettings
from rlsched.policy.dynamic.replay import (
    ENDS_AT_ANNOTATION,
    LIFETIME_ANNOTATION,
    USAGE_ANNOTATION,
    Compression,
    PodTimeline,
    SlicePod,
    Tolerance,
    compare,
    draw_slice,
    format_comparison,
    measure_timelines,
    sample_nodes,
    tick_times,
    usage_from_annotations,
)
from rlsched.policy.dynamic.simulator import DynamicSettings, LivingCluster

REPO = Path(__file__).resolve().parents[2]
NODES = [NodeSpec(f"n{i}", 32000, 131072, 4, "V100M16") for i in range(6)]
PODS = [
    PodSpec("w1", 8000, 16384, 1, 1000, (), 0, 900, "LS"),
    PodSpec("s1", 4000, 8192, 1, 500, (), 0, 600, "BE"),
    PodSpec("c1", 4000, 8192, 0, 0, (), 0, 1200, "BE"),
    PodSpec("big", 64000, 8192, 1, 1000, (), 0, 100, "BE"),  # more cpu than any node: rejected
]
TYPICAL = typical_pods(PODS[:-1])
SETTINGS = DynamicSettings(arrivals=ArrivalSettings(load=0.8, window_s=1800.0))


def load_script(name: str) -> ModuleType:
    return load_hack_script(name)


# -- the slice ---------------------------------------------------------------------------------------


def test_the_slice_is_the_simulators_run_for_the_seed() -> None:
    cluster, pods = draw_slice(NODES, PODS, 3, TYPICAL, SETTINGS)
    ref = LivingCluster(NODES, PODS, 3, TYPICAL, SETTINGS)  # what run_dynamic builds for seed 3
    assert [(p.arrival_s, p.lifetime_s, p.spec) for p in pods] == [
        (a.time, a.lifetime, s) for a, s in zip(ref.arrivals, ref.specs, strict=True)
    ]
    assert [p.index for p in pods] == list(range(len(pods)))
    back = usage_from_annotations([json.loads(json.dumps(p.usage)) for p in pods])
    np.testing.assert_allclose(back.gpu_mean, ref.usage.gpu_mean, atol=1e-6)
    np.testing.assert_allclose(back.cpu_std, ref.usage.cpu_std, atol=1e-6)
    np.testing.assert_allclose(back.mem_max, ref.usage.mem_max, atol=1e-6)
    assert [p.usage["gpuMilli"] for p in pods] == [s.gpu_request_milli for s in ref.specs]
    assert [p.latency_sensitive for p in pods] == [s.qos == "LS" for s in ref.specs]
    assert all(p.rejected == (p.spec.name == "big") for p in pods)
    assert any(p.initial for p in pods) and any(not p.initial for p in pods)
    assert cluster.rate == ref.rate
    other = draw_slice(NODES, PODS, 4, TYPICAL, SETTINGS)[1]
    assert [p.arrival_s for p in other] != [p.arrival_s for p in pods]


def test_compression_maps_simulated_and_real_seconds() -> None:
    c = Compression(6.0)
    assert c.real(3600.0) == 600.0
    assert c.sim(5.0) == 30.0
    with pytest.raises(ValueError, match="positive"):
        Compression(0.0)


def test_node_sample_is_deterministic_ordered_and_sized() -> None:
    nodes = [NodeSpec(f"n{i:03d}", 1000, 1024) for i in range(50)]
    a, b = sample_nodes(nodes, 12, 5), sample_nodes(nodes, 12, 5)
    assert a == b and len(a) == 12 and len(set(n.name for n in a)) == 12
    assert [n.name for n in a] == sorted(n.name for n in a)
    assert sample_nodes(nodes, 12, 6) != a
    assert sample_nodes(nodes, 80, 5) == nodes


# -- measures from timelines -------------------------------------------------------------------------


def slice_pod(name: str, arrival: float, gpu_milli: int = 1000, rejected: bool = False) -> SlicePod:
    spec = PodSpec(name, 1000, 1024, 1 if gpu_milli else 0, gpu_milli, (), 0, 100, "BE")
    return SlicePod(0, spec, arrival, 100.0, {}, False, rejected)


def test_measures_follow_the_simulators_definitions() -> None:
    t0, f = 1000.0, Compression(2.0)  # window 120 sim s = 60 real s; ticks at 0, 30, 60, 90 sim = t0 + 0, 15, 30, 45
    tls = [
        # a start pod holding one card until real t0 + 30: counted at the first two ticks
        PodTimeline(slice_pod("a", -50.0), created=t0 - 5, bound=t0 - 4, deleted=t0 + 30, node="n0"),
        # arrives at 10 sim s, created at t0 + 5, bound 3 real s later: waits 6 sim s; half a card from tick 1 on
        PodTimeline(slice_pod("b", 10.0, 500), created=t0 + 5, bound=t0 + 8, node="n1"),
        # never bound: waits until the window's end, 2 × (60 − 25) = 70 sim s
        PodTimeline(slice_pod("c", 50.0), created=t0 + 25, node=None, unschedulable=True),
        # fits nowhere: rejected, not a wait
        PodTimeline(slice_pod("d", 60.0, rejected=True), created=t0 + 30, unschedulable=True),
        # arrives after the window: not measured
        PodTimeline(slice_pod("e", 130.0), created=t0 + 65, bound=t0 + 66, node="n0"),
    ]
    hot = np.array([[True, False], [False, False], [True, True], [False, False]])
    ls = np.array([[2, 1], [0, 0], [1, 1], [5, 5]])
    m = measure_timelines(
        tls, t0=t0, compression=f, window_s=120.0, interval_s=30.0, gpu_capacity_milli=4000, hot=hot, ls_pods=ls
    )
    assert m["mean_allocated_gpu_pct"] == pytest.approx((1000 + 1500 + 500 + 500) / 4 / 4000 * 100)
    assert m["wait_p50_s"] == pytest.approx(38.0)
    assert m["wait_mean_s"] == pytest.approx(38.0)
    assert m["wait_p99_s"] == pytest.approx(6 + 0.99 * 64)
    assert m["window_pods"] == 2 and m["still_waiting"] == 1 and m["rejected"] == 1
    assert m["sla_hot_node_pct"] == pytest.approx(3 * 30 / (120 * 2) * 100)
    assert m["sla_ls_pod_seconds"] == pytest.approx((2 + 1 + 1) * 30)
    with pytest.raises(ValueError, match="ticks"):
        measure_timelines(
            tls, t0=t0, compression=f, window_s=150.0, interval_s=30.0, gpu_capacity_milli=4000, hot=hot, ls_pods=ls
        )


def test_ticks_are_the_simulators_scrapes() -> None:
    assert list(tick_times(120.0, 30.0)) == [0.0, 30.0, 60.0, 90.0]
    assert list(tick_times(100.0, 30.0)) == [0.0, 30.0, 60.0, 90.0]  # the last one counts 10 s
    assert list(tick_times(20.0, 30.0)) == [0.0]
    assert len(tick_times(1740.0, 8.7)) == 200  # 1740 / 8.7 is a hair above 200 in floating point
    assert len(tick_times(1260.0, 0.7)) == 1800


def test_comparison_applies_absolute_or_relative_tolerance() -> None:
    tol = {"x": Tolerance(absolute=1.0, relative=0.1), "y": Tolerance(absolute=0.0, relative=0.1)}
    rows = compare({"x": 50.0, "y": 0.5}, {"x": 45.0, "y": 0.0}, tol)
    assert [(r["metric"], r["ok"]) for r in rows] == [("x", False), ("y", False)]
    assert rows[0]["relDiff"] == pytest.approx(5 / 45) and rows[1]["relDiff"] is None
    assert Tolerance(1.0, 0.1).allows(10.9, 10.0) and Tolerance(1.0, 0.1).allows(100.0, 91.0)
    assert not Tolerance(1.0, 0.1).allows(102.0, 91.0)
    table = format_comparison(rows)
    assert "| x | 50.000 | 45.000 | +11.1 % | max(1, 10 %) | NO |" in table
    assert "n/a" in table


# -- the exporter's usage mode -----------------------------------------------------------------------


def node(name: str, cpu: str, memory: str, gpus: int) -> dict[str, Any]:
    alloc = {"cpu": cpu, "memory": memory, "nvidia.com/gpu": str(gpus)}
    return {"metadata": {"name": name}, "status": {"allocatable": alloc}}


def pod(node_name: str, cpu: str, memory: str, usage: dict[str, Any] | None) -> dict[str, Any]:
    ann = {USAGE_ANNOTATION: json.dumps(usage)} if usage is not None else {}
    return {
        "metadata": {"name": "p", "annotations": ann},
        "spec": {"nodeName": node_name, "containers": [{"resources": {"requests": {"cpu": cpu, "memory": memory}}}]},
    }


def usage(cpu: float, gpu: float, gpu_milli: int, ls: bool, cv: float = 0.0) -> dict[str, Any]:
    return {
        "cpu": cpu,
        "mem": 0.5,
        "gpu": gpu,
        "cpuStd": cv * cpu,
        "memStd": 0.0,
        "gpuStd": cv * gpu,
        "cpuMax": 12.0,
        "memMax": 2.0,
        "gpuMilli": gpu_milli,
        "ls": ls,
    }


@pytest.fixture(scope="module")
def exporter_module() -> ModuleType:
    return load_script("load_exporter")


def test_usage_mode_sums_the_annotated_usage_per_node(exporter_module: ModuleType) -> None:
    nodes = [node("a", "4", "8Gi", 2), node("b", "2000m", "4Gi", 0)]
    pods = [
        pod("a", "2", "2Gi", usage(0.5, 0.8, 1000, ls=True)),  # cpu 1 core, gpu 0.8 card
        pod("a", "1000m", "2Gi", usage(1.0, 0.4, 500, ls=False)),  # cpu 1 core, gpu 0.2 card
        pod("a", "4", "8Gi", None),  # no annotation: idle
        pod("b", "3", "1Gi", usage(1.0, 0.0, 0, ls=True)),  # bursts past the node: unclipped
        pod("elsewhere", "1", "1Gi", usage(1.0, 1.0, 1000, ls=True)),  # not a covered node
    ]
    out = exporter_module.usage_per_node(nodes, pods, np.random.default_rng(0))
    assert out["a"] == pytest.approx({"cpu": 0.5, "memory": 0.25, "gpu": 0.5, "ls_pods": 1.0})
    assert out["b"] == pytest.approx({"cpu": 1.5, "memory": 0.125, "gpu": 0.0, "ls_pods": 1.0})
    assert set(out) == {"a", "b"}


def test_usage_mode_draws_noise_around_the_mean(exporter_module: ModuleType) -> None:
    nodes = [node("a", "4", "8Gi", 4)]
    pods = [pod("a", "1", "1Gi", usage(0.4, 0.4, 1000, ls=False, cv=0.3))]
    rng = np.random.default_rng(1)
    draws = np.array([exporter_module.usage_per_node(nodes, pods, rng)["a"]["gpu"] for _ in range(2000)])
    assert draws.std() > 0.01  # one fresh scrape each time, as in the simulator
    assert draws.mean() == pytest.approx(0.1, rel=0.03)  # the model's factor has mean one


def exporter(module: ModuleType, usage_mode: bool) -> Any:
    args = argparse.Namespace(usage_annotations=usage_mode, usage_seed=0, targets_dir=None, port=0)
    return module.Exporter(args)


def page(exp: Any, name: str) -> str:
    class Request:
        match_info = {"node": name}

    return str(asyncio.run(exp.node_metrics(Request())).text)


def test_exporter_publishes_usage_gauges_only_in_usage_mode(exporter_module: ModuleType) -> None:
    nodes = [node("a", "4", "8Gi", 2)]
    pods = [pod("a", "2", "2Gi", usage(0.5, 0.8, 1000, ls=True))]
    on = exporter(exporter_module, True)
    on.apply(nodes, pods)
    assert on.nodes["a"].value("cpu") == pytest.approx(0.25)
    text = page(on, "a")
    assert 'rlsched_node_utilization{resource="gpu"} 0.400000' in text
    assert "rlsched_node_latency_sensitive_pods 1" in text
    off = exporter(exporter_module, False)
    off.apply(nodes, pods)
    # the default: a hashed base plus 0.7 × the requested share, whatever the annotation says
    assert off.nodes["a"].value("cpu") == pytest.approx(exporter_module.base_load("a", "cpu") + 0.7 * 0.5)
    assert "rlsched_node_utilization" not in page(off, "a")


# -- the driver's pods -------------------------------------------------------------------------------


def test_replayed_pods_carry_usage_and_a_compressed_end() -> None:
    driver = load_script("replay_dynamic")
    _, pods = draw_slice(NODES, PODS, 3, TYPICAL, SETTINGS)
    first_start = next(p for p in pods if p.initial)
    first_arrival = next(p for p in pods if not p.initial)
    c = Compression(6.0)
    body = driver.pod_body(first_arrival, "x", c, t0=1_000_000.0)
    ann = body["metadata"]["annotations"]
    assert json.loads(ann[USAGE_ANNOTATION]) == first_arrival.usage
    assert ann[LIFETIME_ANNOTATION] == f"{first_arrival.lifetime_s / 6:.3f}s"
    assert ENDS_AT_ANNOTATION not in ann
    assert body["spec"]["schedulerName"] == "rl-scheduler"
    start = driver.pod_body(first_start, "y", c, t0=1_000_000.0)["metadata"]["annotations"]
    ends = datetime.fromisoformat(start[ENDS_AT_ANNOTATION]).timestamp()
    assert ends == pytest.approx(1_000_000.0 + first_start.lifetime_s / 6, abs=1e-5)


def test_the_extender_reads_the_published_usage_at_the_compressed_scrape_interval() -> None:
    driver = load_script("replay_dynamic")
    conf = driver.extender_load("published", Compression(6.0), SETTINGS)
    assert conf["intervalS"] == 5.0 and conf["staleAfterS"] == 20.0
    assert set(conf["queries"]) == {"cpu", "memory"}
    assert 'resource="cpu"' in conf["queries"]["cpu"]
    assert driver.extender_load("node-exporter", Compression(6.0), SETTINGS) is None


@pytest.mark.parametrize("factor", [1.0, 6.0, 9.0, 30.0, 120.0])
def test_the_published_load_settings_pass_the_extenders_own_checks_at_any_compression(factor: float) -> None:
    """The extender refuses timings that could serve a value past staleAfterS; at 9× and more the
    default 5 s query timeout no longer fit under the compressed staleness."""
    from rlsched.extender.settings import PrometheusSettings, build, validate

    conf = load_script("replay_dynamic").extender_load("published", Compression(factor), SETTINGS)
    validate(build(PrometheusSettings, conf, "prometheus."), "prometheus.")


@pytest.mark.parametrize("body", ['{"cpu": null}', '{"cpu": [1]}', '{"cpu": {}}', '"x"', "[1]", "not json"])
def test_pinning_a_load_that_is_not_a_number_is_a_400(exporter_module: ModuleType, body: str) -> None:
    from aiohttp.test_utils import TestClient, TestServer

    async def go() -> int:
        exp = exporter(exporter_module, False)
        exp.apply([node("a", "4", "8Gi", 2)], [])
        async with TestClient(TestServer(exp.app())) as client:
            r = await client.put("/loads/a", data=body)
            return r.status

    assert asyncio.run(go()) == 400


def test_the_openb_replay_fails_when_a_placement_differs_from_the_simulator() -> None:
    replay = load_script("replay_openb")
    assert replay.exit_status(0, 10, 10, False) == 0
    assert replay.exit_status(0, 9, 10, False) == 1  # one pod placed elsewhere than the simulator placed it
    assert replay.exit_status(0, 9, 10, True) == 0
    assert replay.exit_status(2, 10, 10, True) == 1  # a placement the simulator's model calls impossible


@pytest.mark.parametrize("script", ["replay_openb", "replay_dynamic"])
def test_the_replays_check_json_before_the_run_and_make_its_folder(
    script: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--json runs/bench/x.json`` (docs/replay.md) on a fresh clone: the folder is made, and a path that
    cannot be written is refused in one line before the minutes of the run, not after them."""
    module = load_script(script)
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text("")
    pods.write_text("")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as exc:
        module.main(["--nodes", str(nodes), "--pods", str(pods), "--json", str(blocker / "bench" / "out.json")])
    assert exc.value.code == 2
    assert f"--json {blocker / 'bench' / 'out.json'}: {blocker} is a file, not a folder" in capsys.readouterr().err
    replay = load_script("replay_openb")
    out = tmp_path / "runs" / "bench" / "out.json"
    replay.write_json(out, "{}")
    assert out.read_text() == "{}"


@pytest.mark.parametrize("cpu_milli", [0, 333, 4000])
def test_replayed_pods_are_predicted_by_served_target_load_packing_as_in_the_simulator(cpu_milli: int) -> None:
    """A replay pod read back by the extender scores as its trace pod does in the simulator under
    TargetLoadPacking, which predicts a pod's cpu from its containers' limits and requests: no cpu or
    memory limit on replay pods, and no cpu request at all for a trace pod with cpu 0 (a "0m" request
    is predicted at 0, the simulator's "no request" at 1000m)."""
    from rlsched.extender.objects import GpuConventions, pod_info
    from rlsched.policy.cluster import ClusterState
    from rlsched.policy.scorers.trimaran import CPU, TargetLoadPackingScorer

    rlstack = load_script("rlstack")
    trace = PodSpec("p", cpu_milli, 2048, 1, 500, (), 0, 600, "BE")
    body = rlstack.pod_from_spec(trace, "p")
    body["metadata"]["uid"] = "uid-p"
    served = pod_info(body, GpuConventions()).spec
    assert served is not None
    state = ClusterState([NodeSpec(f"n{i}", 4000, 8192, 4, "V100M16") for i in range(4)])
    state.load[:, CPU] = [0.0, 0.1, 0.3, 0.6]
    scorer = TargetLoadPackingScorer()
    nodes = np.arange(4)
    assert (
        scorer.score(state, state.request(served), nodes).values.tolist()
        == scorer.score(state, state.request(trace), nodes).values.tolist()
    )
