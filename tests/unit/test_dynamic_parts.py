"""The living-cluster mode's parts: the arrival process, the load scraper, the objective's arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from rlsched.policy import ClusterState, NodeSpec, PodSpec
from rlsched.policy.dynamic.arrivals import ArrivalSettings, arrival_rate, draw_arrivals, lifetimes
from rlsched.policy.dynamic.objective import DynamicResult, ObjectiveWeights
from rlsched.policy.dynamic.scrape import CPU, MEMORY, LoadScraper, ScrapeSettings
from rlsched.policy.feasibility import feasible_mask, fits_on

PODS = [
    PodSpec("whole", 4000, 8192, 1, 1000, (), 0, 100),  # 1000 milli × 100 s
    PodSpec("share", 2000, 4096, 1, 500, (), 10, 310),  # 500 milli × 300 s
    PodSpec("cpu", 1000, 1024, 0, 0, (), 5, 10**7),  # no GPU; lifetime capped
]


def test_lifetimes_are_the_trace_s_clipped_to_the_settings() -> None:
    settings = ArrivalSettings(max_lifetime_s=1000.0)
    assert lifetimes(PODS, settings).tolist() == [100.0, 300.0, 1000.0]


def test_arrival_rate_is_little_s_law() -> None:
    # E[GPU × lifetime] = (1000·100 + 500·300 + 0) / 3 = 83,333.3 milli·s; capacity 4,000 milli at
    # load 0.5 → 2,000 milli busy on average → rate = 2,000 / 83,333.3 = 0.024 pods/s.
    settings = ArrivalSettings(load=0.5, max_lifetime_s=1000.0)
    assert arrival_rate(PODS, 4000, settings) == pytest.approx(0.024)


def test_arrivals_are_seeded_and_start_in_steady_state() -> None:
    settings = ArrivalSettings(load=0.8, window_s=50_000.0, max_lifetime_s=1000.0)
    one = draw_arrivals(PODS, 40_000, settings, np.random.default_rng(3))
    two = draw_arrivals(PODS, 40_000, settings, np.random.default_rng(3))
    assert one == two
    initial = [a for a in one if a.time < 0]
    window = [a for a in one if a.time >= 0]
    rate = arrival_rate(PODS, 40_000, settings)
    mean_life = float(lifetimes(PODS, settings).mean())
    # Poisson(rate × E[L]) alive at 0 and Poisson(rate × window) arriving: within 4 standard deviations.
    for count, mean in ((len(initial), rate * mean_life), (len(window), rate * settings.window_s)):
        assert abs(count - mean) < 4 * mean**0.5
    assert [a.time for a in initial] == sorted(a.time for a in initial)  # oldest first
    assert all(0 < a.lifetime <= 1000.0 for a in one)
    assert all(a.time < settings.window_s for a in window)


def test_arrivals_need_lifetimes() -> None:
    with pytest.raises(ValueError, match="deletion_time"):
        lifetimes([PodSpec("p", 1000, 1024, 1, 1000)], ArrivalSettings())


def test_an_empty_pod_list_is_refused_with_a_reason() -> None:
    """An empty list made a NaN arrival rate, and numpy's "lam < 0 or lam is NaN" further on."""
    with pytest.raises(ValueError, match="pod list is empty"):
        arrival_rate([], 4000, ArrivalSettings())
    with pytest.raises(ValueError, match="pod list is empty"):
        draw_arrivals([], 4000, ArrivalSettings(), np.random.default_rng(1))


def test_a_lifetime_that_is_not_a_number_is_refused() -> None:
    pods = [PodSpec("nan", 1000, 1024, 1, 1000, (), float("nan"), 100.0)]
    with pytest.raises(ValueError, match="not a finite number"):
        arrival_rate(pods, 4000, ArrivalSettings())


def test_arrival_settings_refuse_nonsense() -> None:
    with pytest.raises(ValueError):
        ArrivalSettings(load=0)
    with pytest.raises(ValueError):
        ArrivalSettings(min_lifetime_s=10, max_lifetime_s=5)


def test_scraper_values_age_into_nan_like_the_extender_s() -> None:
    state = ClusterState([NodeSpec("a", 8000, 8192, 1, "T4"), NodeSpec("b", 8000, 8192, 1, "T4")])
    scraper = LoadScraper(2, ScrapeSettings(noise_std=0.0, stale_after_s=60.0))
    rng = np.random.default_rng(0)
    scraper.scrape(0.0, np.array([0.5, 0.25]), np.array([0.1, 0.2]), rng)
    versions = state.node_version.copy()
    assert scraper.publish(state, 30.0) == 0
    assert state.load[:, CPU].tolist() == [0.5, 0.25] and state.load[:, MEMORY].tolist() == [0.1, 0.2]
    assert (state.node_version == versions + 1).all()  # a changed row invalidates per-node caches
    assert scraper.publish(state, 61.0) == 2  # 61 s old > 60 s: both stale
    assert np.isnan(state.load).all()


def test_the_scraped_load_stops_at_the_capacity_as_a_real_node_s_series_does() -> None:
    # The pods' summed demand may pass the node's capacity; node-exporter's series cannot, and the
    # extender clamps what it reads to 0..1: the features must not see values serving never shows.
    state = ClusterState([NodeSpec(n, 8000, 8192, 1, "T4") for n in "abc"])
    scraper = LoadScraper(3, ScrapeSettings(noise_std=0.0))
    scraper.scrape(0.0, np.array([2.5, 1.0, 0.4]), np.array([1.3, 0.0, 0.2]), np.random.default_rng(0))
    scraper.publish(state, 0.0)
    assert state.load[:, CPU].tolist() == [1.0, 1.0, 0.4] and state.load[:, MEMORY].tolist() == [1.0, 0.0, 0.2]
    noisy = LoadScraper(3, ScrapeSettings(noise_std=0.5))  # noise cannot push it past 1 either
    for t in range(20):
        noisy.scrape(float(t), np.array([0.99, 3.0, 0.0]), np.array([0.99, 3.0, 0.0]), np.random.default_rng(t))
        assert 0.0 <= noisy.value.min() and noisy.value.max() <= 1.0
    assert np.nanmax(noisy.window_stats()[0]) <= 1.0  # load-watcher's view reads the same series


def test_a_missed_scrape_keeps_the_old_value_until_it_is_stale() -> None:
    state = ClusterState([NodeSpec("a", 8000, 8192, 1, "T4")])
    scraper = LoadScraper(1, ScrapeSettings(noise_std=0.0, miss_probability=1.0, stale_after_s=60.0))
    scraper.value[:] = 0.7
    scraper.taken_at[:] = 0.0
    scraper.scrape(30.0, np.array([0.1]), np.array([0.1]), np.random.default_rng(0))
    assert scraper.misses == 1
    scraper.publish(state, 30.0)
    assert state.load[0, CPU] == 0.7  # the old value, 30 s old
    scraper.publish(state, 90.0)
    assert np.isnan(state.load[0, CPU])


def test_load_std_is_the_window_s_standard_deviation() -> None:
    state = ClusterState([NodeSpec("a", 8000, 8192, 1, "T4")])
    scraper = LoadScraper(1, ScrapeSettings(noise_std=0.0, interval_s=1.0, window_s=3.0))
    rng = np.random.default_rng(0)
    for t, v in enumerate([0.9, 0.1, 0.2, 0.3]):  # the window keeps the last three: 0.1, 0.2, 0.3
        scraper.scrape(float(t), np.array([v]), np.array([v / 2]), rng)
    scraper.publish(state, 3.0)
    assert state.load_std[0, CPU] == pytest.approx(np.std([0.1, 0.2, 0.3]))
    assert state.load_std[0, MEMORY] == pytest.approx(np.std([0.05, 0.1, 0.15]))  # memory too (load-watcher)


def test_fits_on_agrees_with_the_feasibility_mask() -> None:
    rng = np.random.default_rng(1)
    nodes = [NodeSpec(f"n{i}", 16000, 65536, int(rng.integers(0, 5)) or 0, "V100M16") for i in range(30)]
    nodes = [
        NodeSpec(n.name, n.cpu_milli, n.memory_mib, n.gpu_count, n.gpu_model if n.gpu_count else "") for n in nodes
    ]
    state = ClusterState(nodes)
    filler = state.request(PodSpec("f", 3000, 8192, 1, 300))
    for _ in range(60):
        fits = np.flatnonzero(feasible_mask(state, filler))
        if len(fits):
            node = int(rng.choice(fits))
            card = int(np.argmax(state.card_free[node]))
            state.place(filler, node, (card,))
    for pod in (PodSpec("a", 2000, 4096, 1, 700), PodSpec("b", 1000, 1024, 2, 1000), PodSpec("c", 8000, 1024)):
        req = state.request(pod)
        mask = feasible_mask(state, req)
        assert [fits_on(state, req, n) for n in range(state.num_nodes)] == mask.tolist()


def test_objective_arithmetic() -> None:
    state = ClusterState(
        [NodeSpec("a", 8000, 8192, 2, "T4", price=3600.0), NodeSpec("b", 8000, 8192, 2, "T4", price=7200.0)]
    )
    result = DynamicResult.start("p", 0, state, 1.0)
    # 10 s with node a hot and busy (2 LS pods there), 1,000 of 4,000 milli allocated, 400 milli
    # stranded; then 30 s with nothing hot, both busy, 3,000 allocated, 0 stranded.
    result.add_interval(
        10, 1000, 400.0, np.array([True, False]), np.array([2, 5]), np.array([True, False]), 1, state.price
    )
    result.add_interval(
        30, 3000, 0.0, np.array([False, False]), np.array([2, 5]), np.array([True, True]), 0, state.price
    )
    result.finish(np.array([0.0, 10.0, 20.0, 600.0]), still_waiting=0, rejected=0, scrape_misses=0, seconds=0.0)
    # allocation (10·1000 + 30·3000) / 40 / 4000 = 62.5 %; stranded 10·400 / 40 / 4000 = 2.5 %
    assert result.mean_allocated_gpu_pct == pytest.approx(62.5)
    assert result.stranded_gpu_pct == pytest.approx(2.5)
    # hot node-seconds 10 of 80 = 12.5 %; LS pod-seconds on hot nodes 2 × 10 = 20
    assert result.sla_hot_node_pct == pytest.approx(12.5) and result.sla_ls_pod_seconds == 20
    # cost: busy price-seconds (10·1 + 30·3) per hour-price of 3 → 100 / (40 · 3) = 83.3 %
    assert result.cost_pct == pytest.approx(100 / 120 * 100)
    assert result.wait_mean_s == 157.5 and result.wait_p50_s == 15.0
    # objective: −(0.5 · 157.5/300 + 0.5 · 0.8333 + 1 · 0.125 + 1 · 0.025)
    expected = -(0.5 * 157.5 / 300 + 0.5 * (100 / 120) + 0.125 + 0.025)
    assert result.objective(ObjectiveWeights()) == pytest.approx(expected)


class _MissSecondNode:
    """A scrape's random stream in which node 0 is scraped and node 1 missed (no noise)."""

    def normal(self, *_: object, **__: object) -> float:
        return 0.0

    def random(self, n: int) -> np.ndarray:
        return np.array([0.9, 0.1])


def test_a_stale_node_reads_unmeasured_without_the_load_watcher_view() -> None:
    """publish wrote the window's deviation for every node: on a copy of the state (the rebalancer's
    planner scores on one, without the load-watcher view) a stale node had load NaN but a deviation,
    and LoadVariationRiskBalancing scored it as measured at 0 % load: the best node."""
    import dataclasses

    from rlsched.policy.scorers import LoadVariationRiskBalancingScorer

    state = ClusterState([NodeSpec("ok", 8000, 8192, 1, "T4"), NodeSpec("stale", 8000, 8192, 1, "T4")])
    settings = ScrapeSettings(noise_std=0.0)
    scraper = LoadScraper(2, settings)
    busy = np.array([0.3, 0.9])
    scraper.scrape(0.0, busy, busy, np.random.default_rng(0))
    scraper.settings = dataclasses.replace(settings, miss_probability=0.5)
    for t in range(30, 301, 30):
        scraper.scrape(float(t), busy, busy, _MissSecondNode())  # type: ignore[arg-type]
    scraper.publish(state, 300.0)
    assert np.isnan(state.load[1]).all() and np.isnan(state.load_std[1]).all()
    work = state.copy()
    scores = LoadVariationRiskBalancingScorer().score(work, work.request(PodSpec("p", 1000, 1024)), np.arange(2))
    assert scores.values[1] == 0 < scores.values[0]
