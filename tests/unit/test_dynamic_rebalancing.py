"""The rebalancer in the living cluster (policy/dynamic/rebalancing.py) and ``--rebalancer`` on the CLI."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from living_fixtures import NODES
from openb_files import write_openb

from rlsched.cli import main as rlsched_main
from rlsched.policy import ClusterState, NodeSpec, PodSpec, decide, make_scorer, typical_pods
from rlsched.policy.dynamic.arrivals import ArrivalSettings
from rlsched.policy.dynamic.objective import DynamicResult
from rlsched.policy.dynamic.rebalancing import (
    HighNodeUtilizationSettings,
    RebalancerSettings,
    RebalanceStats,
    high_node_utilization,
    run_rebalanced,
)
from rlsched.policy.dynamic.simulator import DynamicSettings, LivingCluster, run_dynamic

PODS = [
    PodSpec("w1", 8000, 16384, 1, 1000, (), 0, 3000, "LS"),
    PodSpec("w2", 16000, 32768, 2, 1000, (), 0, 5000, "BE"),
    PodSpec("s1", 4000, 8192, 1, 500, (), 0, 2600, "LS"),
    PodSpec("s2", 2000, 4096, 1, 250, (), 0, 3300, "BE"),
    PodSpec("c1", 4000, 8192, 0, 0, (), 0, 4200, "BE"),
]
TYPICAL = typical_pods(PODS)
SETTINGS = DynamicSettings(arrivals=ArrivalSettings(load=0.9, window_s=3600.0))


def rebalanced(rebalancer: str, seed: int = 3, **kw: object) -> tuple[DynamicResult, RebalanceStats]:
    rebalancing = RebalancerSettings(**kw)  # type: ignore[arg-type]
    scorer = make_scorer("fgd", TYPICAL)
    return run_rebalanced(NODES, PODS, scorer, seed, TYPICAL, rebalancer, SETTINGS, rebalancing, "fgd")


def test_no_rebalancer_is_the_plain_simulator() -> None:
    plain = run_dynamic(NODES, PODS, make_scorer("fgd", TYPICAL), 3, TYPICAL, SETTINGS, "fgd")
    result, stats = rebalanced("none")
    assert result.summary() | {"seconds": 0} == plain.summary() | {"seconds": 0}
    assert stats.evicted == 0


def test_the_heuristic_moves_pods_within_its_budgets() -> None:
    result, stats = rebalanced("heuristic", min_age_s=0.0, max_moves_per_hour=6, max_moves_per_cycle=2)
    r, s = result, stats
    assert 0 < s.evicted <= 6
    assert r.evictions == s.evicted
    assert r.migrations_per_100_pod_hours == pytest.approx(100 * s.evicted / r.pod_hours)
    settled = s.landed_as_planned + s.landed_elsewhere + s.back_on_same_node + s.not_placed
    assert settled == s.evicted
    assert set(s.reasons) <= {"fragmentation", "hot-node"}


def test_young_pods_are_not_moved() -> None:
    _, stats = rebalanced("heuristic", min_age_s=10**6)
    assert stats.evicted == 0


def test_a_lifetime_cap_of_zero_moves_nothing() -> None:
    _, stats = rebalanced("heuristic", min_age_s=0.0, max_moves_per_pod=0, max_moves_per_hour=1000)
    assert stats.evicted == 0


def test_unknown_rebalancer_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown rebalancer"):
        rebalanced("defrag")


@dataclass
class FakeCluster:
    """What high_node_utilization reads: the state, where each pod runs, and its spec."""

    state: ClusterState
    specs: list[PodSpec] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)

    @property
    def node_of(self) -> np.ndarray:
        return np.array(self.nodes, dtype=np.int64)

    def add(self, spec: PodSpec, node: int) -> int:
        self.state.place(self.state.request(spec), node, ())
        self.specs.append(spec)
        self.nodes.append(node)
        return len(self.specs) - 1


def hnu_cluster(d_cpu: int, d_mem: int = 6000) -> FakeCluster:
    # X: a (1 core, 1000 MiB) → cpu 10 %, memory 10 %: underutilized.
    # Y: c (LS, 0.5 core, 500 MiB) and b (BE, 1.5 cores, 500 MiB) → cpu 20 % (≤ 20 counts), memory 10 %.
    # Z: d (d_cpu, d_mem) → above: the only node that receives.
    nodes = [NodeSpec(n, 10000, 10000, 1, "V100") for n in ("X", "Y", "Z")]
    fake = FakeCluster(ClusterState(nodes))
    fake.add(PodSpec("a", 1000, 1000, qos="BE"), 0)
    fake.add(PodSpec("c", 500, 500, qos="LS"), 1)
    fake.add(PodSpec("b", 1500, 500, qos="BE"), 1)
    fake.add(PodSpec("d", d_cpu, d_mem, qos="LS"), 2)
    return fake


@pytest.mark.parametrize(
    ("d_cpu", "allowed", "expected"),
    [
        # Room on Z: cpu 10000 − 7500 = 2500, memory 4000, GPU 1000, pods 109. X first (same memory as Y,
        # 1000 MiB, less cpu). a: cpu room 1500. Then Y, BestEffort before Burstable: b: cpu room 0 → stop.
        (7500, 10, ["a", "b"]),
        # cpu room 4000: a → 3000, b → 1500, c → 1000: all three.
        (6000, 10, ["a", "b", "c"]),
        (6000, 1, ["a"]),  # the per-cycle budget
        # d at 1000 milli cpu and 1000 MiB: Z is underutilized too; every node is, nothing to do.
        (1000, 10, []),
    ],
)
def test_high_node_utilization_golden(d_cpu: int, allowed: int, expected: list[str]) -> None:
    fake = hnu_cluster(d_cpu, 1000 if d_cpu == 1000 else 6000)
    cluster = cast(LivingCluster, fake)
    chosen = high_node_utilization(cluster, [0, 1, 2, 3], allowed, HighNodeUtilizationSettings())
    assert [fake.specs[i].name for i, _, _ in chosen] == expected


def test_high_node_utilization_moves_only_eligible_pods() -> None:
    fake = hnu_cluster(6000)
    chosen = high_node_utilization(cast(LivingCluster, fake), [2], 10, HighNodeUtilizationSettings())
    assert [fake.specs[i].name for i, _, _ in chosen] == ["b"]


def test_high_node_utilization_runs_in_the_simulator() -> None:
    settings = replace(RebalancerSettings(min_age_s=0.0), high_node_utilization=HighNodeUtilizationSettings(50, 50, 50))
    scorer = make_scorer("fgd", TYPICAL)
    result, stats = run_rebalanced(NODES, PODS, scorer, 3, TYPICAL, "high-node-utilization", SETTINGS, settings)
    assert result.evictions == stats.evicted
    assert set(stats.reasons) <= {"high-node-utilization"}


@pytest.fixture
def trace(tmp_path: Path) -> tuple[Path, Path]:
    return write_openb(tmp_path, NODES, PODS)


def test_cli_rebalancer_rows_and_column(
    trace: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = trace
    out = tmp_path / "dyn.json"
    code = rlsched_main(
        ["evaluate", "--mode", "dynamic", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd",
         "--rebalancer", "none,heuristic,high-node-utilization", "--seeds", "1-2", "--jobs", "1",
         "--json", str(out), "--window", "1800"]
    )  # fmt: skip
    assert code == 0
    text = capsys.readouterr().out
    assert "migr/100 pod-h" in text and "fgd+heuristic" in text and "fgd+high-node-utilization" in text
    data = json.loads(out.read_text())
    assert data["settings"]["rebalancers"] == ["none", "heuristic", "high-node-utilization"]
    assert [r["policy"] for r in data["runs"]][::2] == ["fgd", "fgd+heuristic", "fgd+high-node-utilization"]


def test_cli_refuses_an_unknown_rebalancer(trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = trace
    code = rlsched_main(
        ["evaluate", "--mode", "dynamic", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd",
         "--rebalancer", "defrag"]
    )  # fmt: skip
    assert code == 2 and "defrag" in capsys.readouterr().err


class _DelayFirst:
    """FGD with a delay head that holds every pod once for 60 s."""

    def __init__(self) -> None:
        self._fgd = make_scorer("fgd", TYPICAL)
        self.name = "fgd-delay"
        self.seen: set[int] = set()

    def __getattr__(self, name: str) -> object:
        return getattr(self._fgd, name)

    def verdict(self, state: object, req: object, feasible: object, scores: object) -> tuple[str, str, float] | None:
        key = id(req)
        if key in self.seen:
            return None
        self.seen.add(key)
        return ("delay", "first look", 60.0)


def test_no_rebalancer_serves_the_delay_head_as_the_plain_simulator_does() -> None:
    plain = run_dynamic(NODES, PODS, cast("Any", _DelayFirst()), 3, TYPICAL, SETTINGS, "d")
    result, _ = run_rebalanced(NODES, PODS, cast("Any", _DelayFirst()), 3, TYPICAL, "none", SETTINGS, None, "d")
    assert plain.holds > 0
    assert result.summary() | {"seconds": 0} == plain.summary() | {"seconds": 0}


def test_room_an_eviction_frees_is_offered_to_the_waiting_pods_first() -> None:
    nodes = [NodeSpec("a", 32000, 131072, 2, "V100M16")]
    pods = [PodSpec("p", 1000, 1024, 2, 1000, (), 0, 3000, "BE")]
    typical = typical_pods(pods)
    settings = DynamicSettings(arrivals=ArrivalSettings(load=3.0, window_s=3600.0))
    cluster = LivingCluster(nodes, pods, 1, typical, settings)
    scorer = make_scorer("fgd", typical)
    evicted: list[int] = []

    def evict_once(c: LivingCluster) -> None:
        if not evicted and c.now >= 600 and len(c.waiting) > 0 and len(c.running()):
            evicted.append(int(c.running()[0]))
            c.evict(evicted[0])

    cluster.tick_hooks.append(evict_once)
    firsts: list[int] = []
    for i in cluster.decisions():
        d = decide(scorer, cluster.state, cluster.request(i), cluster.tiebreak)
        if d is not None:
            cluster.place(i, d.node, d.cards)
        if evicted and not firsts and cluster.node_of[i] >= 0:
            firsts.append(i)
    assert evicted and firsts and firsts[0] != evicted[0]  # a pod that waited got the room, not the evicted one


def test_the_minimum_age_counts_from_the_placement_not_the_arrival() -> None:
    settings = DynamicSettings(arrivals=ArrivalSettings(load=1.5, window_s=3600.0))
    ages: list[float] = []
    original = LivingCluster.evict

    def spy(self: LivingCluster, i: int) -> int:
        ages.append(self.now - (self.placed_at[i] if not np.isnan(self.placed_at[i]) else -np.inf))
        return original(self, i)

    for seed in (1, 2, 3, 4, 5):
        LivingCluster.evict = spy  # type: ignore[method-assign]
        try:
            run_rebalanced(
                NODES,
                PODS,
                make_scorer("fgd", TYPICAL),
                seed,
                TYPICAL,
                "heuristic",
                settings,
                RebalancerSettings(min_age_s=600.0, max_moves_per_cycle=4),
            )
        finally:
            LivingCluster.evict = original  # type: ignore[method-assign]
    assert ages and min(ages) >= 600.0


def test_cli_rebalancer_rows_are_one_per_chooser_and_learned_files_are_named(
    trace: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``learned:a.json,learned:b.json`` once merged into one "learned" row of twice the runs, and
    ``none,none`` counted every seed twice: now each file is its own row, and a repeated chooser runs once."""
    from rlsched.policy.rebalance import RebalanceSettings
    from rlsched.policy.rebalance_weights import weights_of, write_weights_file

    nodes, pods = trace
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    for path in (first, second):
        write_weights_file(path, weights_of(RebalanceSettings()), {"test": True})
    out = tmp_path / "dyn.json"
    code = rlsched_main(
        ["evaluate", "--mode", "dynamic", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd",
         "--rebalancer", f"none,none,learned:{first},learned:{second},learned:{tmp_path}/./a.json",
         "--seeds", "1", "--jobs", "1", "--json", str(out), "--window", "900"]
    )  # fmt: skip
    assert code == 0
    rows = [line.split()[:2] for line in capsys.readouterr().out.splitlines()[2:] if line.startswith("fgd")]
    assert rows == [["fgd", "1"], ["fgd+learned:a.json", "1"], ["fgd+learned:b.json", "1"]]
    assert json.loads(out.read_text())["settings"]["rebalancers"] == ["none", f"learned:{first}", f"learned:{second}"]

    other = tmp_path / "elsewhere"
    other.mkdir()
    write_weights_file(other / "a.json", weights_of(RebalanceSettings()), {"test": True})
    code = rlsched_main(
        ["evaluate", "--mode", "dynamic", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd",
         "--rebalancer", f"learned:{first},learned:{other / 'a.json'}", "--seeds", "1", "--jobs", "1",
         "--json", str(out)]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "would both be reported as 'learned:a.json'" in err and err.count("\n") == 1


def test_the_planners_what_ifs_do_not_draw_the_runs_random_ties(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner placed its what-ifs with the run's tie-break, so under a Trimaran placement policy
    (kube-scheduler's random ties) every planning cycle advanced the run's tie stream, even one that
    moved nothing: the live placements after it differed from the run without a rebalancer."""
    from rlsched.policy.dynamic import rebalancing

    advanced: list[bool] = []
    heuristic = rebalancing.RebalanceHook._heuristic

    def spy(self: Any, cluster: LivingCluster, eligible: Any, allowed: int) -> Any:
        ties = cluster.tiebreak.ties
        assert ties is not None
        before = ties.bit_generator.state["state"]["state"]
        moves = heuristic(self, cluster, eligible, allowed)
        advanced.append(ties.bit_generator.state["state"]["state"] != before)
        return moves

    monkeypatch.setattr(rebalancing.RebalanceHook, "_heuristic", spy)
    settings = DynamicSettings(arrivals=ArrivalSettings(load=0.9, window_s=3600.0))
    for seed in range(1, 4):
        run_rebalanced(NODES, PODS, make_scorer("target-load-packing", TYPICAL), seed, TYPICAL, "heuristic", settings)
    assert advanced and not any(advanced)


@pytest.mark.parametrize(("interval", "cycles"), [(30.0, 10), (45.0, 10), (50.0, 10), (90.0, 7)])
def test_cycles_keep_their_schedule_when_the_scrape_interval_does_not_divide_it(interval: float, cycles: int) -> None:
    """The next cycle was counted from the scrape the last one ran at, so 60 s cycles ran every 90 s at
    45 s scrapes (7 in ten minutes instead of 10) and every 100 s at 50 s. A cycle runs at the first
    scrape at or after each multiple of ``cycle_s``; one a scrape cannot reach is skipped (90 s
    scrapes: one cycle per scrape)."""
    from rlsched.policy.dynamic.scrape import ScrapeSettings

    settings = DynamicSettings(
        arrivals=ArrivalSettings(load=0.9, window_s=600.0), scrape=ScrapeSettings(interval_s=interval)
    )
    scorer = make_scorer("fgd", TYPICAL)
    _, stats = run_rebalanced(NODES, PODS, scorer, 3, TYPICAL, "heuristic", settings, RebalancerSettings(cycle_s=60.0))
    assert stats.cycles == cycles
