"""benchmarks/qos_placement_probe.py: the two QoS rules reduce to their baselines, and qos-apart keeps
other pods off nodes that run a latency-sensitive pod while another node can take them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from benchmark_scripts import load_benchmark

from rlsched.policy.cluster import NodeSpec, PodSpec
from rlsched.policy.dynamic.arrivals import ArrivalSettings
from rlsched.policy.dynamic.objective import DynamicResult
from rlsched.policy.dynamic.simulator import DynamicSettings, LivingCluster, run_dynamic
from rlsched.policy.scorers import make_scorer
from rlsched.policy.typical import typical_pods

probe = load_benchmark("qos_placement_probe")
NODES = [NodeSpec(f"n{i}", 32000, 131072, 4, "V100M16") for i in range(6)] + [
    NodeSpec(f"t{i}", 16000, 65536, 2, "T4") for i in range(4)
]
SHAPES = [
    ("w1", 8000, 16384, 1, 1000),
    ("w2", 16000, 32768, 2, 1000),
    ("s1", 4000, 8192, 1, 500),
    ("c1", 4000, 8192, 0, 0),
]
SETTINGS = DynamicSettings(arrivals=ArrivalSettings(load=0.9, window_s=3600.0))


def pods(qos: str) -> list[PodSpec]:
    return [
        PodSpec(name, cpu, mem, n, milli, (), 0, 3000 + 400 * i, qos)
        for i, (name, cpu, mem, n, milli) in enumerate(SHAPES)
    ]


def figures(r: DynamicResult) -> tuple[float, ...]:
    return (r.stranded_gpu_pct, r.sla_hot_node_pct, r.sla_ls_pod_seconds, r.cost_pct, r.mean_allocated_gpu_pct)


@pytest.mark.parametrize("rule", ["qos-split", "qos-apart"])
@pytest.mark.parametrize("qos, baseline", [("BE", "fgd"), ("LS", "load-variation-risk-balancing")])
def test_with_one_class_a_rule_is_its_baseline(rule: str, qos: str, baseline: str) -> None:
    trace = pods(qos)
    typical = typical_pods(trace)
    played = probe.play_rule(rule, NODES, trace, typical, SETTINGS, seed=3)
    base = run_dynamic(NODES, trace, make_scorer(baseline, typical), 3, typical, SETTINGS)
    assert figures(played) == figures(base)


def test_mixed_classes_differ_from_both_baselines() -> None:
    trace = pods("LS")[:2] + pods("BE")[2:]
    typical = typical_pods(trace)
    split = figures(probe.play_rule("qos-split", NODES, trace, typical, SETTINGS, seed=3))
    assert all(
        split != figures(run_dynamic(NODES, trace, make_scorer(b, typical), 3, typical, SETTINGS))
        for b in probe.BASELINES
    )


def test_apart_nodes_leave_out_nodes_with_a_latency_sensitive_pod() -> None:
    trace = pods("LS")[:1] + pods("BE")[1:]
    cluster = LivingCluster(NODES, trace, 3, typical_pods(trace), SETTINGS)
    ls = int(np.flatnonzero(cluster.latency_sensitive)[0])
    other = int(np.flatnonzero(~cluster.latency_sensitive)[0])
    req = cluster.request(other)
    assert probe.apart_nodes(cluster, req) is not None and 0 in probe.apart_nodes(cluster, req)
    cluster.place(ls, 0, [0])
    apart = probe.apart_nodes(cluster, req)
    assert apart is not None and 0 not in apart and len(apart) >= 1
    one = LivingCluster(NODES[:1], trace, 3, typical_pods(trace), dataclasses.replace(SETTINGS))
    one.place(int(np.flatnonzero(one.latency_sensitive)[0]), 0, [0])
    assert probe.apart_nodes(one, one.request(int(np.flatnonzero(~one.latency_sensitive)[0]))) is None


def test_apart_places_differently_from_split_on_mixed_classes() -> None:
    trace = [*pods("LS"), *(dataclasses.replace(p, name=f"{p.name}-be") for p in pods("BE"))]
    typical = typical_pods(trace)
    split = probe.play_rule("qos-split", NODES, trace, typical, SETTINGS, seed=3)
    apart = probe.play_rule("qos-apart", NODES, trace, typical, SETTINGS, seed=3)
    assert figures(split) != figures(apart)
