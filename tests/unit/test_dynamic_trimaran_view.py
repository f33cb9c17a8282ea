"""What the living-cluster simulator shows Trimaran's scorers, against upstream's rules.

kubernetes-sigs/scheduler-plugins@903da7df (``pkg/trimaran``) and paypal/load-watcher v0.2.4 (the
Prometheus provider): a 15-minute ``avg_over_time`` / ``stddev_over_time`` of cpu and memory, the
predicted cpu of pods bound in the last 60 s (TargetLoadPacking), and kube-scheduler's random ties.
The learned models' inputs (``ClusterState.load``, the latest scrape) must not move.
"""

from __future__ import annotations

import numpy as np
import pytest
from living_fixtures import NODES, SHORT_LIVED

from rlsched.policy import NodeSpec, PodSpec, decide, make_scorer, typical_pods
from rlsched.policy.cluster import ClusterState
from rlsched.policy.dynamic.arrivals import ArrivalSettings
from rlsched.policy.dynamic.scrape import CPU, MEMORY, LoadScraper, ScrapeSettings
from rlsched.policy.dynamic.simulator import DynamicSettings, LivingCluster, run_dynamic
from rlsched.policy.scorers import TieBreak
from rlsched.policy.scorers.trimaran import LOAD_WATCHER_VIEW, predict_cpu_milli

PODS = [
    *SHORT_LIVED,
    PodSpec("c0", 0, 1024, 0, 0, (), 0, 200, "BE"),  # no cpu request: predicted at 1000m
]
TYPICAL = typical_pods(PODS)


def settings(load: float = 0.9, window_s: float = 1800.0) -> DynamicSettings:
    return DynamicSettings(arrivals=ArrivalSettings(load=load, window_s=window_s))


# -- the scraper: a 15-minute range of cpu and memory --------------------------------------------


def test_the_window_is_load_watcher_s_fifteen_minutes() -> None:
    assert ScrapeSettings().window_s == 900.0 and ScrapeSettings().window_scrapes == 30
    assert ScrapeSettings(interval_s=60.0).window_scrapes == 15


def test_mean_and_std_cover_the_last_fifteen_minutes_while_load_stays_the_latest_scrape() -> None:
    state = ClusterState([NodeSpec("a", 8000, 8192, 1, "T4")])
    scraper = LoadScraper(1, ScrapeSettings(noise_std=0.0))
    cpu = np.linspace(0.1, 0.8, 40)
    for k, v in enumerate(cpu):
        scraper.scrape(30.0 * k, np.array([v]), np.array([1 - v]), np.random.default_rng(k))
    scraper.publish(state, 30.0 * 39)
    mean, std = scraper.window
    assert mean[0].tolist() == pytest.approx([cpu[-30:].mean(), (1 - cpu[-30:]).mean()])
    assert std[0].tolist() == pytest.approx([cpu[-30:].std(), (1 - cpu[-30:]).std()])
    assert state.load_std[0, [CPU, MEMORY]].tolist() == pytest.approx(std[0].tolist())  # memory's deviation too
    assert state.load[0, CPU] == cpu[-1] and state.load[0, MEMORY] == pytest.approx(1 - cpu[-1])  # features' input


def test_one_sample_per_timestamp_and_a_single_sample_has_no_deviation() -> None:
    """The start's population is placed at time 0: each scrape then replaces the one before, as
    Prometheus keeps one sample per series and timestamp; ``stddev_over_time`` of one sample is 0."""
    state = ClusterState([NodeSpec("a", 8000, 8192, 1, "T4")])
    scraper = LoadScraper(1, ScrapeSettings(noise_std=0.0))
    for v in (0.1, 0.5, 0.3):
        scraper.scrape(0.0, np.array([v]), np.array([v]), np.random.default_rng(0))
    scraper.publish(state, 0.0)
    assert scraper.window[0][0].tolist() == [0.3, 0.3] and scraper.window[1][0].tolist() == [0.0, 0.0]
    scraper.scrape(30.0, np.array([0.5]), np.array([0.5]), np.random.default_rng(0))
    scraper.publish(state, 30.0)
    assert scraper.window[0][0, CPU] == pytest.approx(0.4) and state.load_std[0, CPU] == pytest.approx(0.1)


def test_a_node_missing_from_every_scrape_of_the_window_is_unmeasured() -> None:
    state = ClusterState([NodeSpec("a", 8000, 8192, 1, "T4")])
    scraper = LoadScraper(1, ScrapeSettings(noise_std=0.0, miss_probability=1.0))
    scraper.scrape(0.0, np.array([0.5]), np.array([0.5]), np.random.default_rng(0))
    scraper.publish(state, 0.0)
    assert np.isnan(scraper.window[0]).all() and np.isnan(state.load_std).all()


# -- the simulator: the view, TargetLoadPacking's recently bound pods, ties ---------------------------


def test_the_view_holds_the_pods_bound_less_than_60_s_before_the_last_scrape() -> None:
    cluster = LivingCluster(NODES, PODS, 3, TYPICAL, settings())
    scorer = make_scorer("target-load-packing", TYPICAL)
    ends: list[float] = []
    cluster.tick_hooks.append(lambda c: ends.append(c.now))
    checked = dropped = 0
    for i in cluster.decisions():
        d = decide(scorer, cluster.state, cluster.request(i), cluster.tiebreak)
        if d is not None:
            cluster.place(i, d.node, d.cards)
        if not ends:
            continue  # the start's population: each fill-up scrape shows every pod placed before it
        running = cluster.node_of >= 0
        recent = running & (cluster.bound_at > ends[-1] - 60)
        dropped += int((running & ~recent & (cluster.bound_at > -np.inf)).sum() > 0)
        expected = np.zeros(len(NODES))
        for j in np.flatnonzero(recent):
            expected[cluster.node_of[j]] += predict_cpu_milli(int(cluster.cpu_req[j]), 1000, 1.5)
        view = cluster.state.caches[LOAD_WATCHER_VIEW]
        assert view[2] is cluster.recent_cpu and cluster.recent_cpu.tolist() == pytest.approx(expected.tolist())
        checked += expected.any()
    assert checked > 50 and dropped > 0


def test_the_start_s_population_is_in_the_metrics_once_the_window_begins() -> None:
    cluster = LivingCluster(NODES, PODS, 3, TYPICAL, settings())
    scorer = make_scorer("target-load-packing", TYPICAL)
    for i in cluster.decisions():
        if cluster.result.initial_pods:  # the window has begun
            assert not cluster.recent[cluster.node_of >= 0][np.isinf(cluster.bound_at[cluster.node_of >= 0])].any()
            break
        d = decide(scorer, cluster.state, cluster.request(i), cluster.tiebreak)
        if d is not None:
            cluster.place(i, d.node, d.cards)


def test_the_living_cluster_gives_trimaran_kube_scheduler_s_ties_reproducibly() -> None:
    cluster = LivingCluster(NODES, PODS, 3, TYPICAL, settings())
    assert cluster.tiebreak.ties is not None and TieBreak.seeded(len(NODES), 3).ties is None
    a = run_dynamic(NODES, PODS, make_scorer("target-load-packing"), 3, TYPICAL, settings())
    b = run_dynamic(NODES, PODS, make_scorer("target-load-packing"), 3, TYPICAL, settings())
    assert a.summary() | {"seconds": 0} == b.summary() | {"seconds": 0}
    # a run given its own tie-break (the real-stack replay's) keeps that one's rule
    by_name = TieBreak.by_name([n.name for n in NODES])
    c = run_dynamic(NODES, PODS, make_scorer("target-load-packing"), 3, TYPICAL, settings(), tiebreak=by_name)
    assert by_name.ties is None and c.window_pods == a.window_pods


@pytest.mark.parametrize("policy", ["fgd", "bestfit"])
def test_other_policies_see_what_they_saw_before(policy: str) -> None:
    """Their load input, ``state.load``, is the latest scrape (not the 15-minute view), and
    kube-scheduler's tie stream changes nothing for them. (The before/after evaluation of FGD and the
    bundled models, identical number for number, is in docs/dynamic.md.)"""
    plain = run_dynamic(NODES, PODS, make_scorer(policy, TYPICAL), 3, TYPICAL, settings(), "")
    cluster = LivingCluster(NODES, PODS, 3, TYPICAL, settings())
    cluster.tiebreak.ties = None
    scorer = make_scorer(policy, TYPICAL)
    loads = []
    for i in cluster.decisions():
        d = decide(scorer, cluster.state, cluster.request(i), cluster.tiebreak)
        if d is not None:
            cluster.place(i, d.node, d.cards)
        fresh = ~np.isnan(cluster.state.load[:, CPU])
        loads.append(bool(np.array_equal(cluster.state.load[fresh][:, [CPU, MEMORY]], cluster.scraper.value[fresh])))
    again = cluster.finish(0.0)
    assert all(loads)
    assert again.summary() | {"seconds": 0} == plain.summary() | {"seconds": 0}
