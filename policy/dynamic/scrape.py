"""Node load as a scheduler sees it: sampled like Prometheus, with noise, misses and staleness.

The extender reads per-node utilization from Prometheus every few seconds and keeps each node's
value with the time it was fetched; a value older than ``staleAfterS`` becomes NaN
(``rlsched.extender.prometheus``). This module plays the same rules against the simulated usage,
so a policy trained here sees load the way it will in a cluster: up to one scrape interval old,
sometimes missing, NaN when stale. The rows land in ``ClusterState.load``, which the feature encoder
reads; changed rows bump ``node_version`` like the extender's cache does.

Trimaran's plugins see load differently, through load-watcher (paypal/load-watcher v0.2.4, the
Prometheus provider): ``avg_over_time`` and ``stddev_over_time`` of the node's cpu and memory
utilization over the last 15 minutes (the client asks for ``FifteenMinutes``; it falls back to 10 or
5 only while the watcher has no 15-minute result at all). :meth:`LoadScraper.window_stats` gives that
view from the same scrapes, and :meth:`LoadScraper.publish` writes its standard deviation into
``ClusterState.load_std`` (cpu and memory); the simulator hands the mean to the Trimaran scorers
separately (:data:`rlsched.policy.scorers.trimaran.LOAD_WATCHER_VIEW`), so the features stay what
the models were trained on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cluster import LOAD_METRICS, ClusterState

CPU, MEMORY = LOAD_METRICS.index("cpu"), LOAD_METRICS.index("memory")


@dataclass(frozen=True)
class ScrapeSettings:
    """How the simulated Prometheus samples node load."""

    interval_s: float = 30.0
    """Seconds between scrapes. Assumption: kube-prometheus-stack's default scrape interval (30 s);
    Prometheus' own global default is 60 s."""
    stale_after_s: float = 120.0
    """A node's value older than this is NaN: the extender's default ``staleAfterS``."""
    miss_probability: float = 0.0
    """Chance that one node's scrape fails (its old value stays and ages). Default 0: no published
    failure rate applies; raise it to exercise the staleness handling."""
    noise_std: float = 0.02
    """Standard deviation of additive measurement noise on each utilization fraction (assumption: the
    kubelet, node-exporter and system daemons' own use, not part of any pod)."""
    window_s: float = 900.0
    """The range load-watcher's Prometheus queries average over (``avg_over_time(...[15m])``,
    ``stddev_over_time(...[15m])``): the last ``round(window_s / interval_s)`` scrapes (30 at the
    defaults), at least one."""

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.stale_after_s <= 0 or self.window_s <= 0:
            raise ValueError("interval_s, stale_after_s and window_s must be positive")
        if not 0 <= self.miss_probability <= 1 or self.noise_std < 0:
            raise ValueError("need 0 <= miss_probability <= 1 and noise_std >= 0")

    @property
    def window_scrapes(self) -> int:
        """Scrapes in :attr:`window_s`."""
        return max(1, round(self.window_s / self.interval_s))


class LoadScraper:
    """Keeps each node's last scraped (cpu, memory) and when it was taken, and the scrapes of the
    last :attr:`ScrapeSettings.window_s` (load-watcher's range); publishes into the state."""

    def __init__(self, num_nodes: int, settings: ScrapeSettings):
        self.settings = settings
        self.value = np.full((num_nodes, 2), np.nan)
        self.taken_at = np.full(num_nodes, -np.inf)
        self.history = np.full((settings.window_scrapes, num_nodes, 2), np.nan)
        """The window's samples (ring buffer of scrapes × nodes × (cpu, memory)); NaN: no sample."""
        self.kept = 0
        """Sample times recorded in :attr:`history` (a scrape at the time of the last replaces it)."""
        self.last_at = -np.inf
        self.window: tuple[np.ndarray, np.ndarray] = (np.full((num_nodes, 2), np.nan), np.full((num_nodes, 2), np.nan))
        """(mean, std) over the window at the last :meth:`publish` (:meth:`window_stats`)."""
        self.scrapes = 0
        self.misses = 0

    def scrape(self, now: float, cpu: np.ndarray, memory: np.ndarray, rng: np.random.Generator) -> None:
        """One scrape of the true per-node utilization (fractions of capacity; the pods' summed demand,
        which may pass 1): with noise, clamped to 0..1 as a real node's series is."""
        n = len(cpu)
        noise = rng.normal(0.0, self.settings.noise_std, size=(n, 2)) if self.settings.noise_std else 0.0
        # A node's series stops at its capacity (node-exporter's busy CPU time and used memory cannot
        # pass 100 %) and the extender clamps what it reads to 0..1, so what the pods would use beyond
        # the capacity is not seen: the SLA count reads the unclamped demand, not this.
        measured = np.clip(np.column_stack([cpu, memory]) + noise, 0.0, 1.0)
        ok = rng.random(n) >= self.settings.miss_probability if self.settings.miss_probability else np.ones(n, bool)
        self.value[ok] = measured[ok]
        self.taken_at[ok] = now
        if self.kept and now == self.last_at:
            # one sample per series and timestamp, as in Prometheus: the start's population is placed
            # at time 0 with a scrape after every 1 % of it, and each replaces the one before
            self.history[(self.kept - 1) % len(self.history)][ok] = measured[ok]
        else:
            self.history[self.kept % len(self.history)] = np.where(ok[:, None], measured, np.nan)
            self.kept += 1
        self.last_at = now
        self.scrapes += 1
        self.misses += int(n - ok.sum())

    def window_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std) per node and (cpu, memory) over the window's samples, as Prometheus'
        ``avg_over_time`` and ``stddev_over_time`` compute them (population deviation: 0 for a single
        sample); NaN where the window holds no sample of the node."""
        window = self.history[: min(self.kept, len(self.history))]
        mean = np.full(window.shape[1:], np.nan)
        std = np.full(window.shape[1:], np.nan)
        some = (~np.isnan(window)).any(axis=0)
        if some.any():
            mean[some] = np.nanmean(window[:, some], axis=0)
            std[some] = np.nanstd(window[:, some], axis=0)
        return mean, std

    def publish(self, state: ClusterState, now: float) -> int:
        """Write fresh values into ``state.load`` (stale ones NaN) and the window's standard deviation
        into ``state.load_std`` (stale nodes NaN too: what reads the state without the load-watcher
        view — a copy of it, as the rebalancer plans on — must see a stale node as unmeasured, not as
        measured idle); returns stale nodes. The window's (mean, std) are kept in :attr:`window`."""
        fresh = now - self.taken_at <= self.settings.stale_after_s
        new = np.full_like(state.load, np.nan)
        new[fresh, CPU] = self.value[fresh, 0]
        new[fresh, MEMORY] = self.value[fresh, 1]
        same = (new == state.load) | (np.isnan(new) & np.isnan(state.load))
        changed = ~same.all(axis=1)
        if changed.any():
            state.load[:] = new
            state.node_version[changed] += 1
        self.window = self.window_stats()
        std = self.window[1]
        state.load_std[:, CPU] = np.where(fresh, std[:, 0], np.nan)
        state.load_std[:, MEMORY] = np.where(fresh, std[:, 1], np.nan)
        return int((~fresh).sum())
