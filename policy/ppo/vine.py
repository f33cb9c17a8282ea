"""Branch rollouts with common random numbers: per-decision advantages that survive a 10,000-decision episode.

Why (docs/ppo.md, "Why PPO did not move the policy"): on the FGD protocol pods fail only in the last
few percent of arrivals, so a placement's effect on the return arrives hundreds to thousands of
decisions later, mixed with the effect of every other decision and with the workload's own
seed-to-seed variation. GAE's advantage then rests on a critic that would have to tell apart two
after-states differing by one placement; it cannot, and the advantages are noise. This module
measures each action's effect directly, the way TRPO's *vine* procedure does (Schulman et al., 2015,
§5.2): from a state of a trunk episode, take each of a few candidate actions in a copy of the
simulation and play every copy to the episode's end with the *same* future (the same arrivals, the
same random stream — common random numbers). The returns of the copies differ only because of the
action taken, so ``A_k = R_k − Σ_j w_j R_j`` is a low-variance advantage of action ``k``
(Mao et al., 2019, "Variance reduction for reinforcement learning in input-driven environments",
make the same argument for scheduling: a baseline must condition on the input sequence).

- :func:`collect_trunk` plays one workload seed with the current policy, takes ``points`` states in
  the arrival window, branches ``actions`` groups at each (the policy's most likely ones) and
  returns one :class:`BranchPoint` per state. It is a pure function of its arguments: the trainer
  runs it in worker processes.
- :class:`BranchBatch` turns branch points into a :class:`~rlsched.policy.ppo.agent.RaggedBatch`
  with one row-set per (state, action), for the clipped surrogate in :func:`vine_loss`.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..env import SchedulingCore
from ..features import CLUSTER_SLICE
from ..network import PolicyNetwork, group_offsets, log_softmax
from ..playout import play_out, policy_step
from .agent import Agent, RaggedBatch

RETURN_RESOLUTION = 1e-4
"""Returns (in % of GPU capacity) closer than this are equal: sums of float rewards in another order
differ in the last bits, while one failed pod of 1 milli on a cluster of 10,000 cards is 1e-5 … and
openb's smallest GPU request is 8e-4 % of its cluster."""


@dataclass
class BranchPoint:
    """One trunk state, the actions tried from it and what each led to."""

    x: np.ndarray
    """float32[G, F] candidate group rows."""
    prior: np.ndarray
    """float32[G] FGD-CPU prior per group."""
    offset: np.ndarray
    """float32[G] tie-break offsets per group (``network.group_offsets``)."""
    count: np.ndarray
    """float32[G] nodes per group."""
    cluster: np.ndarray
    """float32[C] cluster context."""
    actions: np.ndarray
    """int64[K] groups tried (most likely first)."""
    logprobs: np.ndarray
    """float32[K] their log-probabilities under the policy that collected them."""
    returns: np.ndarray
    """float64[K] return from this decision to the episode's end after taking each action."""
    arrived: float
    """Arrived GPU demand / capacity at this state."""
    value: float = 0.0
    """The critic's value of this state (diagnostics: how GAE would have judged the actions)."""
    next_values: np.ndarray | None = None
    """float32[K] the critic's value of the state after each tried action (0 at the episode's end)."""
    first_rewards: np.ndarray | None = None
    """float32[K] the reward of the tried action's own step."""


def state_value(net: PolicyNetwork, core: SchedulingCore) -> float:
    """The critic's value of the core's current decision (0 once the episode has ended)."""
    if core.done or core.candidates is None:
        return 0.0
    cand = core.candidates
    h2 = net.hidden(cand.features)
    return net.value(net.pooled(h2, cand.count, cand.features[0, CLUSTER_SLICE]))


def group_node(core: SchedulingCore, group: int) -> int:
    """The node a group stands for: its first node in the tie-break order (what greedy would pick)."""
    cand = core.candidates
    idx = np.flatnonzero(cand.group == group)
    return int(cand.nodes[idx[np.argmin(core.rank_frac[cand.nodes[idx]])]])


def collect_trunk(
    net: PolicyNetwork,
    core: SchedulingCore,
    seed: int,
    points: Sequence[float],
    actions: int,
    rank_scale: float,
    mode: str,
) -> tuple[list[BranchPoint], float]:
    """Play workload ``seed`` with the policy (``mode``), branching at the first decision with more than
    one group after each arrival fraction in ``points`` (ascending). Returns the branch points and the
    trunk's unallocated GPU % at 100 % arrival."""
    out: list[BranchPoint] = []
    core.reset(seed)
    todo = list(points)
    while not core.done:
        cand = core.candidates
        if todo and core.arrived >= todo[0] * core.capacity and cand.num_groups > 1:
            while todo and core.arrived >= todo[0] * core.capacity:
                todo.pop(0)
            s = net.scores(cand.features, cand.prior)
            offsets = group_offsets(cand.group, core.rank_frac[cand.nodes], rank_scale, cand.num_groups)
            lp = log_softmax(s + offsets)
            tried = np.argsort(-lp, kind="stable")[:actions]
            snapshot = pickle.dumps(core, protocol=pickle.HIGHEST_PROTOCOL)
            returns, first, after = [], [], []
            for g in tried:
                branch: SchedulingCore = pickle.loads(snapshot)
                reward, _ = branch.step_node(group_node(branch, int(g)))
                first.append(reward)
                after.append(state_value(net, branch))
                returns.append(reward + play_out(net, branch, rank_scale, mode))
            out.append(
                BranchPoint(
                    cand.features.copy(),
                    cand.prior.astype(np.float32),
                    offsets.astype(np.float32),
                    cand.count.astype(np.float32),
                    cand.features[0, CLUSTER_SLICE].copy(),
                    tried.astype(np.int64),
                    lp[tried].astype(np.float32),
                    quantize(np.asarray(returns, dtype=np.float64)),
                    core.arrived / core.capacity,
                    state_value(net, core),
                    np.asarray(after, dtype=np.float32),
                    np.asarray(first, dtype=np.float32),
                )
            )
        node, _ = policy_step(net, core, rank_scale, mode)
        core.step_node(node)
    return out, float(core.unallocated_at_100())


def quantize(returns: np.ndarray) -> np.ndarray:
    """Returns rounded to :data:`RETURN_RESOLUTION`, so that equal outcomes have exactly equal returns."""
    return np.round(returns / RETURN_RESOLUTION) * RETURN_RESOLUTION


def branch_points(rng: np.random.Generator, window: tuple[float, float], n: int) -> list[float]:
    """``n`` sorted arrival fractions, uniform in ``window``."""
    return sorted(rng.uniform(window[0], window[1], n).tolist())


def advantages(point: BranchPoint) -> tuple[np.ndarray, np.ndarray]:
    """(weights, advantages) of a point's actions: weights are the collecting policy's probabilities
    renormalized over the tried actions; the baseline is the weighted mean return."""
    w = np.exp(point.logprobs - point.logprobs.max())
    w = w / w.sum()
    adv = point.returns - float(w @ point.returns)
    if np.ptp(point.returns) == 0:
        adv = np.zeros_like(adv)
    return w.astype(np.float32), adv.astype(np.float32)


class BranchBatch:
    """Branch points as training tensors: every (point, action) pair is one decision of a ragged batch."""

    def __init__(self, points: Sequence[BranchPoint]):
        self.points = list(points)
        pairs = [(i, k) for i, p in enumerate(self.points) for k in range(len(p.actions))]
        self.point_of = np.array([i for i, _ in pairs], dtype=np.int64)
        self.action = np.array([int(self.points[i].actions[k]) for i, k in pairs], dtype=np.int64)
        self.logprob = np.array([float(self.points[i].logprobs[k]) for i, k in pairs], dtype=np.float32)
        w, a, v = [], [], []
        for p in self.points:
            wp, ap = advantages(p)
            w.extend(wp)
            a.extend(ap)
            v.append(float(wp @ p.returns))
        self.weight = np.array(w, dtype=np.float32)
        self.advantage = np.array(a, dtype=np.float32)
        self.value_target = np.array(v, dtype=np.float32)
        """Per point: the policy-weighted mean branch return (the critic's target)."""

    def __len__(self) -> int:
        return len(self.action)

    def ragged(self, pairs: np.ndarray) -> RaggedBatch:
        """The decisions of ``pairs`` (indices into the (point, action) list)."""
        pts = [self.points[i] for i in self.point_of[pairs]]
        lens = np.array([len(p.x) for p in pts], dtype=np.int64)
        seg = np.repeat(np.arange(len(pts)), lens)
        start = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        return RaggedBatch(
            x=torch.from_numpy(np.concatenate([p.x for p in pts])),
            prior=torch.from_numpy(np.concatenate([p.prior for p in pts])),
            offset=torch.from_numpy(np.concatenate([p.offset for p in pts])),
            count=torch.from_numpy(np.concatenate([p.count for p in pts])),
            seg=torch.from_numpy(seg),
            row_start=torch.from_numpy(start),
            cluster=torch.from_numpy(np.stack([p.cluster for p in pts])),
            special_mask=torch.zeros((len(pts), 2), dtype=torch.bool),
        )


def vine_loss(
    agent: Agent,
    batch: BranchBatch,
    pairs: np.ndarray,
    clip_coef: float,
    adv_scale: float,
    ent_coef: float,
    vf_coef: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped surrogate over tried actions, ``−Σ w_k · min(ρ_k A_k, clip(ρ_k) A_k)``, with A scaled
    by ``1 / adv_scale``, minus the entropy bonus, plus the critic's squared error on the point's
    weighted mean return; and the diagnostics (approx_kl, clipfrac)."""
    b = batch.ragged(pairs)
    action = torch.from_numpy(batch.action[pairs])
    _, newlogprob, entropy, value = agent.get_action_and_value(b, action)
    logratio = newlogprob - torch.from_numpy(batch.logprob[pairs])
    ratio = logratio.exp()
    adv = torch.from_numpy(batch.advantage[pairs]) / adv_scale
    w = torch.from_numpy(batch.weight[pairs])
    n_points = float(len(np.unique(batch.point_of[pairs])))
    surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef) * adv)
    pg_loss = -(w * surrogate).sum() / n_points
    ent = (w * entropy).sum() / n_points
    v_loss = 0.5 * (w * (value - torch.from_numpy(batch.value_target[batch.point_of[pairs]])) ** 2).sum() / n_points
    loss = pg_loss - ent_coef * ent + vf_coef * v_loss
    with torch.no_grad():
        approx_kl = float((w * ((ratio - 1) - logratio)).sum() / n_points)
        clipfrac = float((w * ((ratio - 1).abs() > clip_coef).float()).sum() / n_points)
    return loss, {
        "pg_loss": pg_loss.item(),
        "v_loss": v_loss.item(),
        "entropy": ent.item(),
        "approx_kl": approx_kl,
        "clipfrac": clipfrac,
    }


def trunk_job(job: dict[str, Any]) -> tuple[list[BranchPoint], float]:
    """Worker entry point: ``job`` = params, prior scale, seed, trace, points, actions, rank scale, mode;
    the worker's simulation of trace ``job["trace"]`` comes from :func:`set_worker_cores`."""
    net = PolicyNetwork(job["params"], prior_scale=job["prior_scale"])
    core = _WORKER["cores"][job.get("trace", 0)]
    return collect_trunk(net, core, job["seed"], job["points"], job["actions"], job["rank_scale"], job["mode"])


_WORKER: dict[str, list[SchedulingCore]] = {}
"""The simulations of a worker process, one per trace (built once by the pool's initializer)."""


def set_worker_cores(cores_bytes: bytes) -> None:
    """Pool initializer: the pickled list of simulations, one per trace."""
    _WORKER["cores"] = pickle.loads(cores_bytes)
