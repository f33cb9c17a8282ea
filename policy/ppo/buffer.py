"""Rollout storage for ragged decisions (a variable number of candidate rows per decision).

Per-decision arrays are preallocated ``[num_steps, num_envs]`` (SB3's layout); candidate rows go
into one growing table with a start and length per decision. :meth:`RolloutBuffer.batch` gathers
any set of decisions into a :class:`~rlsched.policy.ppo.agent.RaggedBatch`.
"""

from __future__ import annotations

import numpy as np
import torch

from .agent import RaggedBatch


class RolloutBuffer:
    def __init__(self, num_steps: int, num_envs: int, num_features: int, num_cluster: int, rows_hint: int = 64):
        self.T, self.E, self.F, self.C = num_steps, num_envs, num_features, num_cluster
        shape = (num_steps, num_envs)
        self.row_start = np.zeros(shape, dtype=np.int64)
        self.row_len = np.zeros(shape, dtype=np.int64)
        self.actions = np.zeros(shape, dtype=np.int64)
        self.logprobs = np.zeros(shape, dtype=np.float32)
        self.values = np.zeros(shape, dtype=np.float32)
        self.rewards = np.zeros(shape, dtype=np.float32)
        self.ended = np.zeros(shape, dtype=np.float32)
        """1 where the episode ended right after this decision."""
        self.choice = np.zeros(shape, dtype=np.bool_)
        """True where there was more than one option (only those carry a policy gradient)."""
        self.cluster = np.zeros((*shape, num_cluster), dtype=np.float32)
        self.special_mask = np.zeros((*shape, 2), dtype=np.bool_)
        self.advantages = np.zeros(shape, dtype=np.float32)
        self.returns = np.zeros(shape, dtype=np.float32)
        cap = num_steps * num_envs * rows_hint
        self.x = np.zeros((cap, num_features), dtype=np.float32)
        self.prior = np.zeros(cap, dtype=np.float32)
        self.offset = np.zeros(cap, dtype=np.float32)
        self.count = np.zeros(cap, dtype=np.float32)
        self.rows = 0

    def reset(self) -> None:
        self.rows = 0

    def add(
        self,
        t: int,
        e: int,
        x: np.ndarray,
        prior: np.ndarray,
        offset: np.ndarray,
        count: np.ndarray,
        cluster: np.ndarray,
        special_mask: np.ndarray,
        action: int,
        logprob: float,
        value: float,
    ) -> None:
        g = len(x)
        if self.rows + g > len(self.x):
            self._grow(self.rows + g)
        r = self.rows
        self.x[r : r + g] = x
        self.prior[r : r + g] = prior
        self.offset[r : r + g] = offset
        self.count[r : r + g] = count
        self.rows += g
        self.row_start[t, e] = r
        self.row_len[t, e] = g
        self.cluster[t, e] = cluster
        self.special_mask[t, e] = special_mask
        self.actions[t, e] = action
        self.logprobs[t, e] = logprob
        self.values[t, e] = value
        self.choice[t, e] = g + int(special_mask.sum()) > 1

    def _grow(self, need: int) -> None:
        cap = max(need, 2 * len(self.x))
        for name in ("x", "prior", "offset", "count"):
            old = getattr(self, name)
            new = np.zeros((cap, *old.shape[1:]), dtype=old.dtype)
            new[: self.rows] = old[: self.rows]
            setattr(self, name, new)

    def compute_returns_and_advantage(self, last_values: np.ndarray, gamma: float, gae_lambda: float) -> None:
        """GAE(λ): ``δ_t = r_t + γ·V_{t+1}·(1 − ended_t) − V_t``, ``A_t = δ_t + γλ(1 − ended_t)·A_{t+1}``;
        the decision after the last stored one is bootstrapped with ``last_values``. Returns are
        ``A + V`` (the critic's target)."""
        last = np.zeros(self.E, dtype=np.float32)
        for t in reversed(range(self.T)):
            next_values = last_values if t == self.T - 1 else self.values[t + 1]
            live = 1.0 - self.ended[t]
            delta = self.rewards[t] + gamma * next_values * live - self.values[t]
            last = delta + gamma * gae_lambda * live * last
            self.advantages[t] = last
        self.returns = self.advantages + self.values

    def batch(self, flat_idx: np.ndarray) -> tuple[RaggedBatch, dict[str, torch.Tensor]]:
        """Decisions ``flat_idx`` (into the flattened ``[T·E]`` arrays) as a ragged batch, plus their
        per-decision training arrays."""
        starts = self.row_start.reshape(-1)[flat_idx]
        lens = self.row_len.reshape(-1)[flat_idx]
        seg = np.repeat(np.arange(len(flat_idx)), lens)
        local_start = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        rows = starts[seg] + (np.arange(int(lens.sum())) - local_start[seg])
        b = RaggedBatch(
            x=torch.from_numpy(self.x[rows]),
            prior=torch.from_numpy(self.prior[rows]),
            offset=torch.from_numpy(self.offset[rows]),
            count=torch.from_numpy(self.count[rows]),
            seg=torch.from_numpy(seg),
            row_start=torch.from_numpy(local_start),
            cluster=torch.from_numpy(self.cluster.reshape(-1, self.C)[flat_idx]),
            special_mask=torch.from_numpy(self.special_mask.reshape(-1, 2)[flat_idx]),
        )
        extra = {
            name: torch.from_numpy(getattr(self, name).reshape(-1)[flat_idx])
            for name in ("actions", "logprobs", "values", "advantages", "returns", "choice")
        }
        return b, extra
