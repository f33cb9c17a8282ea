"""The living-cluster simulator end to end on small clusters, and ``rlsched evaluate --mode dynamic``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from living_fixtures import NODES, SHORT_LIVED
from openb_files import write_openb

from rlsched.cli import main as rlsched_main
from rlsched.policy import NodeSpec, PodSpec, make_scorer, typical_pods
from rlsched.policy.dynamic import simulator
from rlsched.policy.dynamic.arrivals import Arrival, ArrivalSettings
from rlsched.policy.dynamic.objective import DynamicResult, SlaSettings
from rlsched.policy.dynamic.scrape import ScrapeSettings
from rlsched.policy.dynamic.simulator import DynamicSettings, LivingCluster, run_dynamic, serve_pod
from rlsched.policy.dynamic.usage import UsageSettings
from rlsched.policy.scorers import Scorer

PODS = [
    *SHORT_LIVED,
    PodSpec("big", 64000, 8192, 1, 1000, (), 0, 100, "BE"),  # more cpu than any node: rejected
]
TYPICAL = typical_pods(PODS[:-1])


def run(policy: str, seed: int = 1, load: float = 0.9, **kw: object) -> object:
    settings = DynamicSettings(arrivals=ArrivalSettings(load=load, window_s=3600.0), **kw)  # type: ignore[arg-type]
    return run_dynamic(NODES, PODS, make_scorer(policy, TYPICAL), seed, TYPICAL, settings, policy)


def test_a_run_is_seeded_and_policies_share_the_workload() -> None:
    a, b = run("fgd"), run("fgd")
    assert a.summary() | {"seconds": 0} == b.summary() | {"seconds": 0}
    c = run("bestfit")
    # common random numbers: the same pods arrive for every policy on a seed
    assert (c.initial_pods, c.window_pods + c.rejected) == (a.initial_pods, a.window_pods + a.rejected)


def test_measures_are_in_range_and_impossible_pods_are_rejected() -> None:
    r = run("fgd", load=1.5)
    assert r.rejected > 0  # "big" asks for more cpu than any node has
    assert 0 < r.mean_allocated_gpu_pct <= 100 and 0 <= r.stranded_gpu_pct <= 100
    assert 0 <= r.sla_hot_node_pct <= 100 and 0 < r.cost_pct <= 100 + 1e-9
    assert r.wait_p99_s >= r.wait_p50_s >= 0
    assert r.wait_p99_s > 0  # 150 % offered load: some pods wait for a departure


def test_waiting_pods_are_placed_after_departures() -> None:
    overloaded = run("fgd", load=1.5)
    light = run("fgd", load=0.3)
    assert overloaded.mean_waiting > light.mean_waiting
    assert overloaded.mean_allocated_gpu_pct > light.mean_allocated_gpu_pct


def test_sla_threshold_one_means_no_hot_node_unless_usage_exceeds_capacity() -> None:
    strict = run("fgd", sla=SlaSettings(cpu_threshold=0.05, gpu_threshold=0.05))
    lax = run("fgd", sla=SlaSettings(cpu_threshold=1.0, gpu_threshold=1.0))
    assert strict.sla_hot_node_pct > lax.sla_hot_node_pct


def test_the_features_see_load_clamped_while_the_sla_count_sees_the_demand() -> None:
    typical = typical_pods(SHORT_LIVED)
    settings = DynamicSettings(arrivals=ArrivalSettings(load=0.9, window_s=3600.0))
    cluster = LivingCluster(NODES, SHORT_LIVED, 1, typical, settings, "fgd")
    seen: list[tuple[float, float]] = []
    cluster.tick_hooks.append(
        lambda c: seen.append((float(np.nanmax(c.state.load, initial=0.0)), float(c.true_cpu.max())))
    )
    result = play(cluster, make_scorer("fgd", typical), lambda _: None)
    published, demand = np.array(seen).T
    assert demand.max() > 1.0  # the pods' bursts add up past a node's capacity ...
    assert published.max() <= 1.0  # ... which the simulated Prometheus, like a real node, does not show
    assert result.sla_hot_node_pct > 0


def test_missed_scrapes_are_counted_and_go_stale() -> None:
    r = run("target-load-packing", scrape=ScrapeSettings(miss_probability=0.5, stale_after_s=40.0))
    assert r.scrape_misses > 0 and r.stale_node_scrapes > 0


def test_load_aware_policy_sees_load() -> None:
    # TargetLoadPacking scores 0 everywhere without load: with load it must decide differently.
    seen = run("target-load-packing")
    blind = run("target-load-packing", scrape=ScrapeSettings(miss_probability=1.0))
    assert seen.summary()["sla_hot_node_pct"] != blind.summary()["sla_hot_node_pct"] or (
        seen.stranded_gpu_pct != blind.stranded_gpu_pct
    )


@pytest.fixture
def trace(tmp_path: Path) -> tuple[Path, Path]:
    return write_openb(tmp_path, NODES, PODS)


def test_cli_dynamic_mode_prints_the_table_and_writes_json(
    trace: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = trace
    out = tmp_path / "dyn.json"
    code = rlsched_main(
        ["evaluate", "--mode", "dynamic", "--nodes", str(nodes), "--pods", str(pods),
         "--policy", "fgd,target-load-packing", "--seeds", "1-2", "--jobs", "1", "--json", str(out), "--window", "1800"]
    )  # fmt: skip
    assert code == 0
    text = capsys.readouterr().out
    assert "stranded %" in text and "target-load-packing" in text and "wins vs first" in text
    data = json.loads(out.read_text())
    assert data["settings"]["window_s"] == 1800 and len(data["runs"]) == 4
    assert all(np.isfinite(r["objective"]) for r in data["runs"])


def test_cli_dynamic_mode_takes_the_objective_from_a_scheduling_policy(
    trace: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = trace
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "kind: SchedulingPolicy\nspec:\n"
        "  objective: {beta: 0.9, slaWeight: 4, slaCpuThreshold: 0.5, slaGpuThreshold: 0.6}\n"
    )
    common = ["evaluate", "--mode", "dynamic", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd",
              "--seeds", "1", "--jobs", "1", "--window", "1800", "--objective-from", str(policy)]  # fmt: skip
    out = tmp_path / "dyn.json"
    assert rlsched_main([*common, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["settings"]["objective"] == {"beta": 0.9, "slaWeight": 4.0, "strandedWeight": 1.0,
                                             "latencyScaleSeconds": 300.0, "slaCpuThreshold": 0.5,
                                             "slaGpuThreshold": 0.6}  # fmt: skip
    assert (data["settings"]["sla_cpu_threshold"], data["settings"]["sla_gpu_threshold"]) == (0.5, 0.6)
    run = data["runs"][0]
    expected = -(0.9 * run["wait_mean_s"] / 300 + 0.1 * run["cost_pct"] / 100 + 4 * run["sla_hot_node_pct"] / 100
                 + run["stranded_gpu_pct"] / 100)  # fmt: skip
    assert run["objective"] == pytest.approx(expected, abs=1e-4)

    # an explicit flag overrides the policy's field; the thresholds move the SLA measure itself
    over = tmp_path / "over.json"
    assert rlsched_main([*common, "--json", str(over), "--beta", "0.1", "--sla-threshold", "0.99"]) == 0
    settings = json.loads(over.read_text())["settings"]
    assert settings["objective"]["beta"] == 0.1 and settings["objective"]["slaWeight"] == 4.0
    assert settings["objective"]["slaCpuThreshold"] == 0.99
    assert json.loads(over.read_text())["runs"][0]["sla_hot_node_pct"] < run["sla_hot_node_pct"], run

    policy.write_text("kind: SchedulingPolicy\nspec: {objective: {beta: 3}}\n")
    assert rlsched_main(common) == 2
    assert "spec.objective.beta: 3 must be a number from 0 to 1" in capsys.readouterr().err


def test_cli_dynamic_mode_refuses_a_bad_load(trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = trace
    code = rlsched_main(
        ["evaluate", "--mode", "dynamic", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd", "--load", "0"]
    )
    assert code == 2 and "load" in capsys.readouterr().err


def test_an_evicted_pod_comes_back_with_the_rest_of_its_lifetime() -> None:
    from rlsched.policy import decide

    settings = DynamicSettings(arrivals=ArrivalSettings(load=0.5, window_s=3600.0))
    cluster = LivingCluster(NODES, PODS, 1, TYPICAL, settings)
    scorer = make_scorer("fgd", TYPICAL)
    moved: dict[str, float] = {}

    def evict_once(c: LivingCluster) -> None:
        if moved or c.now < 600:
            return
        # A pod placed in the window (the start population has no placement time to keep).
        placed = [int(j) for j in c.running() if not np.isnan(c.placed_at[j])]
        if not placed:
            return
        i = placed[0]
        moved.update(pod=i, ends=float(c.ends_at[i]), first=float(c.placed_at[i]), at=c.now)
        c.evict(i)

    cluster.tick_hooks.append(evict_once)
    checked = 0
    for i in cluster.decisions():
        d = decide(scorer, cluster.state, cluster.request(i), cluster.tiebreak)
        if d is not None:
            cluster.place(i, d.node, d.cards)
        if moved and i == moved["pod"] and cluster.node_of[i] >= 0 and not checked:
            # placed again right away: it ends when it would have, and keeps its first placement time
            assert cluster.now == moved["at"] and cluster.ends_at[i] == pytest.approx(moved["ends"])
            assert not np.isnan(moved["first"]) and cluster.placed_at[i] == moved["first"]
            checked += 1
    assert checked == 1
    result = cluster.finish(0.0)
    assert result.evictions == 1 and result.pod_hours > 0
    assert result.migrations_per_100_pod_hours == pytest.approx(100 / result.pod_hours)


@pytest.mark.parametrize(("window", "interval"), [(3600.0, 30.0), (100.0, 60.0), (20.0, 30.0), (3590.0, 30.0)])
def test_the_whole_window_is_measured_when_it_is_not_a_whole_number_of_scrapes(window: float, interval: float) -> None:
    settings = DynamicSettings(
        arrivals=ArrivalSettings(load=0.9, window_s=window), scrape=ScrapeSettings(interval_s=interval)
    )
    r = run_dynamic(NODES, PODS, make_scorer("fgd", TYPICAL), 1, TYPICAL, settings, "fgd")
    assert r._t == pytest.approx(window)
    assert r.mean_allocated_gpu_pct > 0 and r.cost_pct > 0


def test_a_node_holding_pods_that_ask_for_no_cpu_still_costs() -> None:
    pods = [PodSpec("z", 0, 0, 1, 1000, (), 0, 3000, "LS")]
    r = run_dynamic(NODES[:1], pods, make_scorer("fgd", typical_pods(pods)), 1, typical_pods(pods), DynamicSettings())
    assert r.mean_allocated_gpu_pct > 0 and r.cost_pct > 0


def test_missed_scrapes_count_the_window_only() -> None:
    r = run("fgd", scrape=ScrapeSettings(miss_probability=1.0))
    assert r.scrape_misses == len(NODES) * 120  # 10 nodes × 120 scrapes of the hour, none of the start's


def test_a_cluster_without_gpus_is_refused() -> None:
    with pytest.raises(ValueError, match="no node has a GPU"):
        run_dynamic([NodeSpec("cpu", 32000, 131072)], PODS, make_scorer("fgd", TYPICAL), 1, TYPICAL, DynamicSettings())


def hand_made(
    monkeypatch: pytest.MonkeyPatch,
    nodes: list[NodeSpec],
    pods: list[PodSpec],
    arrivals: list[tuple[int, float, float]],
    window: float,
    usage: UsageSettings | None = None,
) -> tuple[LivingCluster, Scorer]:
    """A cluster whose arrivals are ``(trace pod, time, lifetime)`` as given, and FGD over its pods."""
    monkeypatch.setattr(simulator, "draw_arrivals", lambda *_: [Arrival(p, t, life) for p, t, life in arrivals])
    settings = DynamicSettings(
        arrivals=ArrivalSettings(load=0.9, window_s=window),
        scrape=ScrapeSettings(noise_std=0.0),
        usage=usage or UsageSettings(),
    )
    typical = typical_pods(pods)
    return LivingCluster(nodes, pods, 1, typical, settings, "fgd"), make_scorer("fgd", typical)


def play(cluster: LivingCluster, scorer: Scorer, hook: Callable[[LivingCluster], None]) -> DynamicResult:
    cluster.tick_hooks.append(hook)
    for i in cluster.decisions():
        serve_pod(cluster, i, scorer)
    return cluster.finish(0.0)


def evict_at(pod: int, t: float) -> Callable[[LivingCluster], None]:
    def hook(c: LivingCluster) -> None:
        if c.now == t:
            c.evict(pod)

    return hook


@pytest.mark.parametrize(
    ("b_lifetime", "waits", "still_waiting"),
    [
        # b takes a's card when a is evicted at 600; a waits until the window's end (1200): 600 s so far
        (5000.0, [0.0, 590.0, 600.0], 1),
        # b leaves at 900 and a is placed again: it waited 300 s
        (300.0, [0.0, 590.0, 300.0], 0),
    ],
)
def test_a_moved_pod_s_wait_counts_and_a_moved_pod_still_waiting_is_counted(
    monkeypatch: pytest.MonkeyPatch, b_lifetime: float, waits: list[float], still_waiting: int
) -> None:
    """An evicted pod kept its first placement time: its wait after the eviction was in no wait figure,
    and at the end it was not counted as still waiting, so a rebalancer never paid for the pods it left
    pending. One card; a arrives at 0, b at 10 and waits for the card; a is evicted at 600."""
    nodes = [NodeSpec("n0", 8000, 16384, 1, "V100M16")]
    pods = [PodSpec("p", 1000, 1024, 1, 1000, (), 0, 100, "BE")]
    cluster, scorer = hand_made(monkeypatch, nodes, pods, [(0, 0.0, 3000.0), (0, 10.0, b_lifetime)], 1200.0)
    r = play(cluster, scorer, evict_at(0, 600.0))
    assert r.evictions == 1 and r.window_pods == 2  # the window's pods; the eviction adds a wait, not a pod
    assert r.still_waiting == still_waiting
    assert r.wait_mean_s == pytest.approx(np.mean(waits))
    assert r.wait_p50_s == pytest.approx(np.percentile(waits, 50))
    assert r.wait_p99_s == pytest.approx(np.percentile(waits, 99))


def test_a_move_counts_from_the_scrape_it_is_made_at(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scrape recorded its interval before the tick hooks moved pods, so each move showed one
    interval late: here 630 hot node-seconds instead of 600. Two one-card nodes; "hot" uses its node's
    whole CPU (usage = request exactly), "quiet" an eighth; a second quiet pod waits for a card and
    takes n0 when hot is evicted at 600; hot cannot come back."""
    nodes = [NodeSpec("n0", 8000, 16384, 1, "V100M16"), NodeSpec("n1", 8000, 16384, 1, "V100M16")]
    pods = [PodSpec("hot", 8000, 1024, 1, 1000, (), 0, 100, "LS"), PodSpec("quiet", 1000, 1024, 1, 1000, (), 0, 100)]
    exact = UsageSettings(
        cpu_ratio_median=1.0, cpu_ratio_sigma=1e-9, cpu_cv=0.0, gpu_cv=0.0, gpu_idle_fraction=0.999999
    )
    arrivals = [(0, -10.0, 5000.0), (1, -5.0, 5000.0), (1, 100.0, 5000.0)]
    cluster, scorer = hand_made(monkeypatch, nodes, pods, arrivals, 1200.0, exact)
    r = play(cluster, scorer, evict_at(0, 600.0))
    assert r.sla_hot_node_pct / 100 * 2 * 1200 == pytest.approx(600.0)  # n0 hot over [0, 600) only
    assert r.sla_ls_pod_seconds == pytest.approx(600.0)
    assert r.evictions == 1 and r.still_waiting == 1  # hot waits from 600 to the end
