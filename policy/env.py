"""Scheduling as a reinforcement-learning environment over the FGD-protocol simulator.

:class:`SchedulingCore` is the simulation the trainer steps: pods arrive one at a time in the
seeded, inflated order of the FGD protocol (:func:`~rlsched.policy.workload.inflate`), feasibility
is :func:`~rlsched.policy.feasibility.feasible_nodes`, observations are
:class:`~rlsched.policy.features.Candidates` from the one :class:`FeatureEncoder`, and placement is
:meth:`ClusterState.place` with FGD-CPU's card for share pods — the same pieces the simulator and
the extender use. :class:`SchedulingEnv` wraps one core as a gymnasium ``Env`` (fixed-shape
observation over all nodes, an action mask, ``Discrete(N + 2)`` actions) for users who bring their
own RL library; :class:`VectorCore` steps several cores for the trainer.

**Actions** (:class:`ActionLayout`): ``0..N-1`` schedule the pod on node ``i``; ``N`` delay it
(it re-joins the queue ``delay_pods`` arrivals later, at most ``max_delays`` times); ``N+1`` reject
it (it fails). Preemption ("preempt on node i") is reserved as ``N+2..2N+1`` for a later version.
Delay and reject are off by default: the FGD protocol has neither, and they cannot help the
headline metric there.

**Reward** (:class:`RewardConfig`), in percent of the cluster's GPU capacity, so returns read like
the headline metric::

    r = − fail_weight · (GPU milli of pods that failed or were rejected) / capacity · 100
        + frag_weight · (FGD-CPU fragmentation before − after) / capacity · 100     (shaping)
        − cost_weight · price(node) / mean price − load_weight · cpu load(node)

Up to the arrival point where an episode ends, the failed GPU milli *is* the unallocated GPU
(allocated = arrived − failed, and arrivals do not depend on the policy), so with ``fail_weight``
alone the undiscounted return is minus the headline figure. The fragmentation term is
potential-based shaping: it telescopes to the final fragmentation and gives the critic a dense
signal. Pods that fail while no decision is pending (no feasible node) charge the previous decision.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from .cluster import ClusterState, NodeSpec, PodRequest, PodSpec
from .feasibility import feasible_nodes
from .features import NUM_FEATURES, Candidates, FeatureEncoder
from .scorers.base import TieBreak
from .simulator import RequestCache
from .typical import TypicalPods, typical_pods
from .workload import DEFAULT_TARGET, inflate

OBS_BOUND = 1000.0
"""Feature values are clipped to ±this in the gym observation (they are scaled to about 0..1; only a
node price far above the mean could reach it)."""


@dataclass(frozen=True)
class RewardConfig:
    """Weights of the reward terms (see the module docstring)."""

    fail_weight: float = 1.0
    """Per percent of GPU capacity asked by a pod that fails, is rejected, or is still delayed at the end."""
    frag_weight: float = 0.25
    """Per percent of GPU capacity of FGD-CPU fragmentation removed by a placement (shaping)."""
    cost_weight: float = 0.0
    """Per placement, times the node's price relative to the cluster's mean price."""
    load_weight: float = 0.0
    """Per placement, times the node's measured cpu load (0..1; unknown load counts as 0)."""


@dataclass(frozen=True)
class EnvConfig:
    """How an episode runs."""

    target: float = DEFAULT_TARGET
    """Inflate arrivals to this fraction of cluster GPU capacity (the FGD protocol: 1.3)."""
    end_at: float = DEFAULT_TARGET
    """The episode ends once arrived GPU demand exceeds this fraction of capacity (1.005: right after
    the headline 100 % point, which saves the saturated tail in training)."""
    allow_delay: bool = False
    """Offer the delay action."""
    allow_reject: bool = False
    """Offer the reject action."""
    delay_pods: int = 64
    """A delayed pod re-joins the queue this many arrivals later."""
    max_delays: int = 3
    """How often one pod may be delayed."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Reward weights."""

    def __post_init__(self) -> None:
        if not 0 < self.end_at:
            raise ValueError(f"end_at must be positive, got {self.end_at}")
        if self.delay_pods < 1 or self.max_delays < 0:
            raise ValueError("delay_pods must be ≥ 1 and max_delays ≥ 0")


@dataclass(frozen=True)
class ActionLayout:
    """Action ids for a cluster of ``num_nodes`` nodes: nodes, then delay, then reject (then, later, preempt)."""

    num_nodes: int

    @property
    def delay(self) -> int:
        return self.num_nodes

    @property
    def reject(self) -> int:
        return self.num_nodes + 1

    @property
    def size(self) -> int:
        """Number of actions in this version (preempt not yet offered)."""
        return self.num_nodes + 2

    def preempt(self, node: int) -> int:
        """Reserved id of "preempt on ``node``" (not accepted yet)."""
        return self.num_nodes + 2 + node


class SchedulingCore:
    """One FGD-protocol episode at a time, paused at every pod that needs a decision."""

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        pods: Sequence[PodSpec],
        typical: TypicalPods | None = None,
        config: EnvConfig | None = None,
        encoder: FeatureEncoder | None = None,
        name: str = "",
    ):
        if not pods:
            raise ValueError("the workload has no pods")
        self.node_specs = tuple(nodes)
        self.pods = tuple(pods)
        self.typical = typical or typical_pods(pods)
        self.config = config or EnvConfig()
        self.encoder = encoder or FeatureEncoder(self.typical)
        self.name = name
        self.num_nodes = len(self.node_specs)
        self.layout = ActionLayout(self.num_nodes)
        self.capacity = ClusterState(self.node_specs).gpu_milli_capacity
        self.state: ClusterState | None = None
        self.done = True

    # -- episode ---------------------------------------------------------------------------------
    def reset(self, seed: int) -> None:
        """Start the episode of workload seed ``seed`` and stop at the first decision."""
        self.seed = int(seed)
        self.state = ClusterState(self.node_specs)
        self.requests = RequestCache(self.state)
        self.tiebreak = TieBreak.seeded(self.num_nodes, self.seed)
        self.rank_frac = self.tiebreak.rank / (float(self.tiebreak.rank.max()) + 1.0)
        self.queue: list[PodSpec] = inflate(self.pods, self.capacity, self.seed, self.config.target)
        self.queued_before: list[bool] = [False] * len(self.queue)
        self.delays: list[int] = [0] * len(self.queue)
        self.position = 0
        self.arrived = self.allocated = 0
        self.failed_milli = 0
        self.failed_pods = 0
        self.decisions = 0
        self.episode_return = 0.0
        self._sums: dict[int, float] = {}
        self._counts: dict[int, int] = {}
        self._frag = self._cluster_frag()
        self._pending = 0.0
        self.done = False
        self._advance()

    @property
    def pod(self) -> PodSpec:
        return self.queue[self.position]

    def special_mask(self) -> np.ndarray:
        """bool[2]: whether delay and reject are offered for the current pod."""
        cfg = self.config
        return np.array([cfg.allow_delay and self.delays[self.position] < cfg.max_delays, cfg.allow_reject])

    def step_node(self, node: int) -> tuple[float, bool]:
        """Schedule the current pod on ``node`` (must be a candidate); returns (reward, done)."""
        req = self.req
        position = self.position_of(node)
        if position < 0:
            raise ValueError(f"node {node} is not a feasible candidate for pod {self.pod.name}")
        self.state.place(req, node, self.encoder.cards_at(self.state, req, self.candidates, position))
        self.allocated += req.gpu_total
        w = self.config.reward
        reward = 0.0
        if w.cost_weight:
            mean = float(self.state.price.mean())
            reward -= w.cost_weight * (self.state.price[node] / mean if mean > 0 else 1.0)
        if w.load_weight:
            load = self.state.load[node, 0]
            reward -= w.load_weight * (0.0 if math.isnan(load) else float(load))
        if w.frag_weight:
            frag = self._cluster_frag()
            reward += w.frag_weight * (self._frag - frag) * 100.0 / self.capacity
            self._frag = frag
        return self._finish(reward)

    def position_of(self, node: int) -> int:
        """Position of ``node`` among the current candidates, or -1."""
        cand = self.candidates
        if cand is None:
            return -1
        i = int(np.searchsorted(cand.nodes, node))
        return i if i < len(cand.nodes) and cand.nodes[i] == node else -1

    def step_reject(self) -> tuple[float, bool]:
        """Reject the current pod: it fails."""
        return self._finish(self._fail(self.req))

    def step_delay(self) -> tuple[float, bool]:
        """Send the current pod back into the queue ``delay_pods`` arrivals later."""
        if not self.special_mask()[0]:
            raise ValueError("delay is not offered for this pod")
        i = self.position
        at = min(i + 1 + self.config.delay_pods, len(self.queue))
        self.queue.insert(at, self.queue[i])
        self.queued_before.insert(at, True)
        self.delays.insert(at, self.delays[i] + 1)
        return self._finish(0.0, measure=False)

    def _finish(self, reward: float, measure: bool = True) -> tuple[float, bool]:
        self.decisions += 1
        if measure:
            self._measure()
        self.position += 1
        self._pending = reward
        self._advance()
        reward = self._pending
        self.episode_return += reward
        return reward, self.done

    # -- internals -------------------------------------------------------------------------------
    def _advance(self) -> None:
        """Move to the next pod that needs a decision; pods with no option fail on the way."""
        while True:
            if self.position >= len(self.queue) or self.arrived > self.config.end_at * self.capacity:
                self._end()
                return
            i = self.position
            req = self.requests(self.queue[i])
            if not self.queued_before[i]:
                self.queued_before[i] = True
                self.arrived += req.gpu_total
            nodes = feasible_nodes(self.state, req)
            self.req = req
            if len(nodes):
                self.candidates: Candidates | None = self.encoder.encode(self.state, req, nodes)
                return
            if self.special_mask()[0]:
                self.candidates = None
                return
            self._pending += self._fail(req)
            self._measure()
            self.position += 1

    def _fail(self, req: PodRequest) -> float:
        self.failed_pods += 1
        self.failed_milli += req.gpu_total
        return -self.config.reward.fail_weight * req.gpu_total * 100.0 / self.capacity

    def _end(self) -> None:
        # Pods still waiting after a delay count as failed.
        waiting = [
            self.requests(p).gpu_total
            for p, seen in zip(self.queue[self.position :], self.queued_before[self.position :], strict=True)
            if seen
        ]
        for milli in waiting:
            self._pending -= self.config.reward.fail_weight * milli * 100.0 / self.capacity
        self.candidates = None
        self.done = True

    def _measure(self) -> None:
        pct = math.floor(self.arrived * 100 / self.capacity + 0.5)
        if pct <= 100:
            self._sums[pct] = self._sums.get(pct, 0.0) + self.allocated * 100.0 / self.capacity
            self._counts[pct] = self._counts.get(pct, 0) + 1

    def _cluster_frag(self) -> float:
        return float(self.encoder.measures(self.state)[1].node_frag(self.state).sum())

    def unallocated_at_100(self) -> float | None:
        """The headline figure: 100 − mean allocated % over the pod events at 100 % arrival (or at the
        highest arrival % below it that was recorded, as :meth:`RunResult.allocated_at` does); None
        before any pod was measured."""
        if not self._counts:
            return None
        pct = max(self._counts)
        return 100.0 - self._sums[pct] / self._counts[pct]

    def episode_metric(self) -> float | None:
        """What validation compares (lower is better): :meth:`unallocated_at_100`."""
        return self.unallocated_at_100()

    def __getstate__(self) -> dict:
        # Per-state caches are keyed by object ids, which do not survive pickling: drop them.
        d = dict(self.__dict__)
        if d.get("state") is not None:
            d["state"] = d["state"].copy()
        d["encoder"] = FeatureEncoder(
            self.encoder.typical, self.encoder.cpu_weight, self.encoder.use_load, self.encoder.use_qos
        )
        return d

    def __setstate__(self, d: dict) -> None:
        self.__dict__.update(d)
        if getattr(self, "candidates", None) is not None:
            self.candidates = self.encoder.encode(self.state, self.req, self.candidates.nodes)


class VectorCore:
    """Several :class:`SchedulingCore` stepped side by side; an ended episode restarts with the next seed.

    Env ``e`` plays workload seeds ``seed0 + e``, ``seed0 + e + E``, ``seed0 + e + 2E`` … (``E`` envs).
    """

    def __init__(self, cores: Sequence[SchedulingCore], seed0: int):
        if not cores:
            raise ValueError("VectorCore needs at least one core")
        self.cores = list(cores)
        self.next_seed = [seed0 + e for e in range(len(cores))]
        self.finished: list[dict[str, Any]] = []
        """Summaries of episodes that ended since the last :meth:`pop_finished`."""
        for e in range(len(self.cores)):
            self._start(e)

    def _start(self, e: int) -> None:
        core = self.cores[e]
        core.reset(self.next_seed[e])
        self.next_seed[e] += len(self.cores)
        while core.done:  # an episode without any decision (tiny workloads): record it and go on
            self._record(e)
            core.reset(self.next_seed[e])
            self.next_seed[e] += len(self.cores)

    def _record(self, e: int) -> None:
        core = self.cores[e]
        self.finished.append(
            {
                "env": e,
                "trace": core.name,
                "seed": core.seed,
                "return": core.episode_return,
                # the core's episode_metric: unallocated GPU % at 100 % for the FGD protocol,
                # −100 × the objective for the living cluster (rlsched.policy.dynamic.env)
                "unallocated_100": core.episode_metric(),
                "decisions": core.decisions,
                "failed_pods": core.failed_pods,
            }
        )

    def after_step(self, e: int, done: bool) -> None:
        """Call after stepping core ``e``: restarts it when its episode ended."""
        if done:
            self._record(e)
            self._start(e)

    def pop_finished(self) -> list[dict[str, Any]]:
        out, self.finished = self.finished, []
        return out


class SchedulingEnv(gym.Env):
    """A gymnasium environment over one cluster and workload (FGD protocol).

    Observation (a ``Dict``): ``nodes`` float32[N, F] — the feature row of every node for the current
    pod (zeros for infeasible nodes; :data:`rlsched.policy.features.FEATURES` names the columns);
    ``tiebreak_rank`` float32[N] — each node's place in the episode's seeded node order, in [0, 1);
    ``action_mask`` int8[N + 2] — feasible nodes, then delay and reject. The mask is also in
    ``info["action_mask"]``. A masked action rejects the pod (``info["invalid_action"]`` is True).
    Each ``reset`` draws a workload seed from the env's generator unless ``options={"workload_seed": s}``.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        pods: Sequence[PodSpec],
        typical: TypicalPods | None = None,
        config: EnvConfig | None = None,
    ):
        super().__init__()
        self.core = SchedulingCore(nodes, pods, typical, config)
        n = self.core.num_nodes
        self.layout = self.core.layout
        self.action_space = spaces.Discrete(self.layout.size)
        self.observation_space = spaces.Dict(
            {
                "nodes": spaces.Box(-OBS_BOUND, OBS_BOUND, shape=(n, NUM_FEATURES), dtype=np.float32),
                "tiebreak_rank": spaces.Box(0.0, 1.0, shape=(n,), dtype=np.float32),
                "action_mask": spaces.MultiBinary(self.layout.size),
            }
        )

    def _obs(self) -> tuple[dict, dict]:
        core = self.core
        n = core.num_nodes
        rows = np.zeros((n, NUM_FEATURES), dtype=np.float32)
        mask = np.zeros(self.layout.size, dtype=np.int8)
        if not core.done:
            cand = core.candidates
            if cand is not None:
                rows[cand.nodes] = np.clip(cand.features[cand.group], -OBS_BOUND, OBS_BOUND)
                mask[cand.nodes] = 1
            mask[n : n + 2] = core.special_mask()
        obs = {"nodes": rows, "tiebreak_rank": core.rank_frac.astype(np.float32), "action_mask": mask}
        info = {
            "action_mask": mask.copy(),
            "arrived_pct": core.arrived * 100.0 / core.capacity,
            "allocated_pct": core.allocated * 100.0 / core.capacity,
            "failed_gpu_milli": core.failed_milli,
        }
        return obs, info

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        workload_seed = (options or {}).get("workload_seed")
        if workload_seed is None:
            workload_seed = int(self.np_random.integers(2**31 - 1))
        self.core.reset(int(workload_seed))
        return self._obs()

    def step(self, action):
        core = self.core
        if core.done:
            raise RuntimeError("the episode has ended; call reset()")
        action = int(action)
        n = core.num_nodes
        invalid = False
        if 0 <= action < n and core.position_of(action) >= 0:
            reward, done = core.step_node(action)
        elif action == self.layout.delay and core.special_mask()[0]:
            reward, done = core.step_delay()
        elif action == self.layout.reject and core.special_mask()[1]:
            reward, done = core.step_reject()
        else:
            invalid = True
            reward, done = core.step_reject()
        obs, info = self._obs()
        info["invalid_action"] = invalid
        if done:
            info["unallocated_at_100"] = core.unallocated_at_100()
        return obs, float(reward), bool(done), False, info
