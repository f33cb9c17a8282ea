"""The living cluster as a training environment: one decision per pod, with live load and delay.

:class:`LivingCore` is to :class:`~rlsched.policy.dynamic.simulator.LivingCluster` what
:class:`~rlsched.policy.env.SchedulingCore` is to the FGD protocol: the trainer steps it through
the same interface (``candidates``, ``special_mask``, ``step_node``, ``step_delay``), observations
come from the one :class:`~rlsched.policy.features.FeatureEncoder` — now with ``load_cpu``,
``load_mem`` and ``load_known`` live, from the simulated Prometheus — and the learned scorer that
serves is the same network.

**What the agent decides.** The pods of the measured window that have two or more feasible nodes.
The steady-state start is filled by FGD-CPU (fast, and the same for every policy being trained);
a pod with one feasible node goes there (kube-scheduler does not score a single node); a pod with
none waits. With ``allow_delay`` the agent may also hold a pod back for ``hold_s`` seconds (at most
``max_holds`` times); it then comes back as a new decision.

**Reward** (:class:`LivingReward`), per decision, local to what the decision touched, so one
decision's credit is not drowned by thousands of others (the lesson of ``docs/ppo.md``)::

    r = − sla · [the pod pushes its node over the SLA threshold: below before, above after, true usage]
        + frag · (FGD fragmentation of that node before − after) / GPU capacity · 100
        − cost · [the node was idle before] · price / mean price
        − ls · (risk after · LS pods after − risk before · LS pods before) · hours the pod stays
        − delay · hold_s / latency_scale_s        (for a hold)

The ``ls`` term is the decision's expected share of the latency-sensitive SLA count (LS pod-hours on
hot nodes): ``risk`` is the chance a scrape finds the node hot, from its pods' true mean usage and
spread (:meth:`~rlsched.policy.dynamic.simulator.LivingCluster.hot_risk`), times the LS pods it
runs, before and after the pod lands, over the part of the pod's lifetime inside the window. It
charges both ways a decision adds to that count: an LS pod landing where bursts are likely, and any
pod making a node that runs LS pods more likely to burst. What the pod and its neighbours will use
is the simulator's knowledge; the agent sees requests, scraped load and (with the QoS features)
who is latency-sensitive, so it learns what those predict.

The fragmentation term is potential-based shaping (it telescopes to the final fragmentation); the
SLA term is a difference reward: it charges the decision for the change it made to the number of
hot nodes (the measured SLA violations count nodes, not pods), as the simulator knows it from true
usage; the agent sees only scraped, noisy, possibly stale load and the pod's request. A first
version charged every landing on a node that was hot afterwards: PPO learned to avoid hot nodes
(hits per decision 12 % → 2 %) but the hot-node time did not move, because a pod placed on an
already hot node adds no hot node.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cluster import ClusterState, NodeSpec, PodRequest, PodSpec
from ..decision import decide
from ..delay_head import MAX_HOLDS_PER_POD
from ..feasibility import feasible_nodes
from ..features import Candidates, FeatureEncoder
from ..scorers import make_scorer
from ..scorers.base import TieBreak
from ..typical import TypicalPods
from .objective import DynamicResult, ObjectiveWeights
from .simulator import DynamicSettings, LivingCluster


@dataclass(frozen=True)
class LivingReward:
    """Weights of the living-cluster reward terms (see the module docstring)."""

    sla: float = 1.0
    """Per decision that pushes its node over the SLA threshold (true usage, before vs after)."""
    frag: float = 10.0
    """Per percent of GPU capacity of FGD fragmentation removed on the chosen node (shaping)."""
    delay: float = 1.0
    """Per hold, times ``hold_s / latency_scale_s``."""
    cost: float = 0.0
    """Per decision that puts a pod on an idle node (it starts costing money), times the node's price
    relative to the mean price."""
    ls: float = 0.0
    """Per expected latency-sensitive pod-hour on hot nodes the decision adds (see the module docstring)."""


@dataclass(frozen=True)
class LivingConfig:
    """How a training episode in the living cluster runs."""

    settings: DynamicSettings
    reward: LivingReward = LivingReward()
    weights: ObjectiveWeights = ObjectiveWeights()
    """The objective that validation reports (and that chooses the exported model)."""
    allow_delay: bool = False
    hold_s: float = 60.0
    """How long the delay action holds a pod back."""
    max_holds: int = MAX_HOLDS_PER_POD
    fill_policy: str = "fgd-cpu"
    """Who places the steady-state start."""


class LivingCore:
    """One living-cluster episode at a time, paused at every pod the agent decides."""

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        pods: Sequence[PodSpec],
        typical: TypicalPods,
        config: LivingConfig,
        encoder: FeatureEncoder | None = None,
        name: str = "",
    ):
        self.node_specs = tuple(nodes)
        self.pods = tuple(pods)
        self.typical = typical
        self.config = config
        self.encoder = encoder or FeatureEncoder(typical)
        self.name = name
        self.fill = make_scorer(config.fill_policy, typical)
        self.capacity = ClusterState(self.node_specs).gpu_milli_capacity
        self.arrived = 0
        self.done = True
        self.result: DynamicResult | None = None

    # -- episode ---------------------------------------------------------------------------------
    def reset(self, seed: int) -> None:
        self.seed = int(seed)
        self.cluster = LivingCluster(self.node_specs, self.pods, self.seed, self.typical, self.config.settings)
        self.state: ClusterState = self.cluster.state
        self.tiebreak: TieBreak = self.cluster.tiebreak
        self.rank_frac = self.tiebreak.rank / (float(self.tiebreak.rank.max()) + 1.0)
        self._gen: Iterator[int] | None = self.cluster.decisions()
        self.episode_return = 0.0
        self.decisions = 0
        self.sla_hits = 0
        self.ls_exposure = 0.0
        """Expected LS pod-hours on hot nodes the agent's decisions added this episode (the ``ls`` term)."""
        self.failed_pods = 0
        self.result = None
        self.done = False
        self.candidates: Candidates | None = None
        self._advance()

    def special_mask(self) -> np.ndarray:
        """bool[2]: whether delay and reject are offered (reject never is: only what can never fit is
        rejected, and the simulator does that itself)."""
        cfg = self.config
        return np.array([cfg.allow_delay and int(self.cluster.holds[self.pod_index]) < cfg.max_holds, False])

    def step_node(self, node: int) -> tuple[float, bool]:
        cand = self.candidates
        assert cand is not None
        position = int(np.searchsorted(cand.nodes, node))
        if position >= len(cand.nodes) or cand.nodes[position] != node:
            raise ValueError(f"node {node} is not a feasible candidate")
        cards = self.encoder.cards_at(self.state, self.req, cand, position)
        frag = self.cluster.measure.node_frag(self.state)
        before = float(frag[node])
        was_idle = bool(self.state.pods[node] == 0)  # no pod at all (one may ask for no CPU)
        hot_before = self.cluster.hot_after(node)
        w = self.config.reward
        exposure_before = self._ls_exposure(node) if w.ls else 0.0
        self.cluster.place(self.pod_index, node, cards)
        after = float(self.cluster.measure.node_frag(self.state)[node])
        # The difference this pod makes: the node was below the threshold and is above it now. A node
        # already hot counts as hot whatever lands on it, so charging that would not cut hot time.
        hot = self.cluster.hot_after(node) and not hot_before
        self.sla_hits += int(hot)
        reward = -w.sla * float(hot) + w.frag * (before - after) * 100.0 / max(self.capacity, 1)
        if was_idle and w.cost:
            mean_price = float(self.state.price.mean())
            reward -= w.cost * (float(self.state.price[node]) / mean_price if mean_price > 0 else 1.0)
        if w.ls:
            cluster = self.cluster
            hours = (
                min(float(cluster.remaining[self.pod_index]), cluster.settings.arrivals.window_s - cluster.now) / 3600
            )
            added = (self._ls_exposure(node) - exposure_before) * max(hours, 0.0)
            self.ls_exposure += added
            reward -= w.ls * added
        return self._finish(reward)

    def _ls_exposure(self, node: int) -> float:
        """Expected latency-sensitive pods on a hot node at a scrape, for ``node`` as it is now."""
        return self.cluster.hot_risk(node) * float(self.state.ls_pods[node])

    def step_delay(self) -> tuple[float, bool]:
        if not self.special_mask()[0]:
            raise ValueError("delay is not offered for this pod")
        cfg = self.config
        self.cluster.hold(self.pod_index, cfg.hold_s)
        return self._finish(-cfg.reward.delay * cfg.hold_s / cfg.weights.latency_scale_s)

    def step_reject(self) -> tuple[float, bool]:
        raise ValueError("the living cluster offers no reject action to the agent")

    def episode_metric(self) -> float | None:
        """Minus the run's objective × 100 (lower is better, like the FGD protocol's headline)."""
        if self.result is None:
            return None
        return -100.0 * self.result.objective(self.config.weights)

    def _finish(self, reward: float) -> tuple[float, bool]:
        self.decisions += 1
        self._advance()
        self.episode_return += reward
        return reward, self.done

    def _advance(self) -> None:
        """Run the clock to the next pod with a choice to make; place the others as described."""
        gen = self._gen
        assert gen is not None
        cluster = self.cluster
        for i in gen:
            req = cluster.request(i)
            if cluster.arrivals[i].time < 0:
                self._place_with(self.fill, i, req)
                continue
            nodes = feasible_nodes(self.state, req)
            if len(nodes) == 0:
                continue  # it waits for a departure
            if len(nodes) == 1:
                # One place to go: served, a pod with one feasible node is placed unscored and never
                # held (no scores for the delay to beat), so training offers no choice here either.
                self._place_with(self.fill, i, req)
                continue
            self.pod_index, self.req = i, req
            self.candidates = self.encoder.encode(self.state, req, nodes)
            return
        self.candidates = None
        self._gen = None
        self.result = cluster.finish(0.0)
        self.failed_pods = self.result.still_waiting
        self.done = True

    def _place_with(self, scorer: Any, i: int, req: PodRequest) -> None:
        decision = decide(scorer, self.state, req, self.tiebreak)
        if decision is not None:
            self.cluster.place(i, decision.node, decision.cards)

    def __getstate__(self) -> dict[str, Any]:
        # A running episode is a generator, which cannot be pickled: a checkpoint keeps the seed and
        # a resumed run replays the episode from its start.
        d = {k: v for k, v in self.__dict__.items() if k not in ("_gen", "cluster", "state", "candidates", "req")}
        d["_resume_seed"] = getattr(self, "seed", None)
        return d

    def __setstate__(self, d: dict[str, Any]) -> None:
        seed = d.pop("_resume_seed")
        self.__dict__.update(d)
        self.encoder = FeatureEncoder(
            self.encoder.typical, self.encoder.cpu_weight, self.encoder.use_load, self.encoder.use_qos
        )
        if seed is not None and not self.done:
            self.reset(seed)
