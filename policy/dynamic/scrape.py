"""Node load as a scheduler sees it: sampled like Prometheus, with noise, misses and staleness.

The extender reads per-node utilization from Prometheus every few seconds and keeps each node's
value with the time it was fetched; a value older than ``staleAfterS`` becomes NaN
(``rlsched.extender.prometheus``). This module plays the same rules against the simulated usage,
so a policy trained here sees load the way it will in a cluster: up to one scrape interval old,
sometimes missing, NaN when stale. The rows land in ``ClusterState.load`` (and the window's
standard deviation in ``ClusterState.load_std``), which the feature encoder and the load-aware
scorers read; changed rows bump ``node_version`` like the extender's cache does.
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
    std_window: int = 10
    """Scrapes over which ``load_std`` is computed (10 × 30 s = 5 minutes, like Trimaran's
    load-watcher windows)."""

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.stale_after_s <= 0:
            raise ValueError("interval_s and stale_after_s must be positive")
        if not 0 <= self.miss_probability <= 1 or self.noise_std < 0 or self.std_window < 2:
            raise ValueError("need 0 <= miss_probability <= 1, noise_std >= 0 and std_window >= 2")


class LoadScraper:
    """Keeps each node's last scraped (cpu, memory) and when it was taken; publishes into the state."""

    def __init__(self, num_nodes: int, settings: ScrapeSettings):
        self.settings = settings
        self.value = np.full((num_nodes, 2), np.nan)
        self.taken_at = np.full(num_nodes, -np.inf)
        self.history = np.full((settings.std_window, num_nodes), np.nan)
        self.scrapes = 0
        self.misses = 0

    def scrape(self, now: float, cpu: np.ndarray, memory: np.ndarray, rng: np.random.Generator) -> None:
        """One scrape of the true per-node utilization (fractions of capacity)."""
        n = len(cpu)
        noise = rng.normal(0.0, self.settings.noise_std, size=(n, 2)) if self.settings.noise_std else 0.0
        measured = np.clip(np.column_stack([cpu, memory]) + noise, 0.0, None)
        ok = rng.random(n) >= self.settings.miss_probability if self.settings.miss_probability else np.ones(n, bool)
        self.value[ok] = measured[ok]
        self.taken_at[ok] = now
        self.history[self.scrapes % self.settings.std_window] = np.where(ok, measured[:, 0], np.nan)
        self.scrapes += 1
        self.misses += int(n - ok.sum())

    def publish(self, state: ClusterState, now: float) -> int:
        """Write fresh values into ``state.load`` / ``load_std`` (stale ones NaN); returns stale nodes."""
        fresh = now - self.taken_at <= self.settings.stale_after_s
        new = np.full_like(state.load, np.nan)
        new[fresh, CPU] = self.value[fresh, 0]
        new[fresh, MEMORY] = self.value[fresh, 1]
        same = (new == state.load) | (np.isnan(new) & np.isnan(state.load))
        changed = ~same.all(axis=1)
        if changed.any():
            state.load[:] = new
            state.node_version[changed] += 1
        if self.scrapes >= 2:
            window = self.history[: min(self.scrapes, self.settings.std_window)]
            counts = (~np.isnan(window)).sum(axis=0)
            std = np.full(state.num_nodes, np.nan)
            enough = counts >= 2
            std[enough] = np.nanstd(window[:, enough], axis=0)
            state.load_std[:, CPU] = np.where(fresh, std, np.nan)
        return int((~fresh).sum())
