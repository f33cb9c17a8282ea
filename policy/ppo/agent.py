"""The torch twin of :class:`rlsched.policy.network.PolicyNetwork`, over ragged batches of decisions.

A decision has ``G`` candidate groups (one feature row each, see :mod:`rlsched.policy.features`)
and up to two special actions (delay, reject). A batch of ``B`` decisions stores all rows together
(``R = Σ G``) with ``seg[r]`` naming each row's decision; softmax, entropy and pooling are segment
operations. Actions are local: ``a ≥ 0`` is the group index within its decision, ``-1`` delay,
``-2`` reject.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..network import SPECIAL_ACTIONS, param_shapes

NEG = -1e9
"""Logit of a masked action (finite, so 0 · NEG stays 0 in the entropy)."""


@dataclass
class RaggedBatch:
    """Decisions as torch tensors (see the module docstring)."""

    x: torch.Tensor
    """float32[R, F] feature rows."""
    prior: torch.Tensor
    """float32[R] FGD-CPU prior per row (cards)."""
    offset: torch.Tensor
    """float32[R] tie-break offset per row (``network.group_offsets``)."""
    count: torch.Tensor
    """float32[R] nodes in the row's group."""
    seg: torch.Tensor
    """int64[R] decision of each row."""
    row_start: torch.Tensor
    """int64[B] first row of each decision."""
    cluster: torch.Tensor
    """float32[B, C] cluster context per decision."""
    special_mask: torch.Tensor
    """bool[B, 2] whether delay / reject were offered."""

    @property
    def size(self) -> int:
        return int(self.cluster.shape[0])


def layer_init(layer: nn.Linear, std: float = float(np.sqrt(2)), bias: float = 0.0) -> nn.Linear:
    """Orthogonal weights, constant bias (CleanRL)."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


class Agent(nn.Module):
    """Shared per-node scorer + pooled value head + special-action head."""

    def __init__(
        self,
        num_features: int,
        num_cluster: int,
        hidden: tuple[int, int] = (64, 64),
        value_hidden: int = 64,
        prior_scale: float = 50.0,
    ):
        super().__init__()
        h1, h2 = hidden
        pooled = 2 * h2 + num_cluster
        self.num_features, self.num_cluster = num_features, num_cluster
        self.hidden, self.value_hidden, self.prior_scale = (h1, h2), value_hidden, float(prior_scale)
        self.l1 = layer_init(nn.Linear(num_features, h1))
        self.l2 = layer_init(nn.Linear(h1, h2))
        self.out = layer_init(nn.Linear(h2, 1), std=0.01)
        self.v1 = layer_init(nn.Linear(pooled, value_hidden))
        self.v_out = layer_init(nn.Linear(value_hidden, 1), std=1.0)
        self.special = layer_init(nn.Linear(pooled, len(SPECIAL_ACTIONS)), std=0.01)

    # -- numpy exchange ------------------------------------------------------------------------
    _NAMES = {
        "w1": ("l1", "weight"),
        "b1": ("l1", "bias"),
        "w2": ("l2", "weight"),
        "b2": ("l2", "bias"),
        "w_out": ("out", "weight"),
        "b_out": ("out", "bias"),
        "v1": ("v1", "weight"),
        "c1": ("v1", "bias"),
        "v_out": ("v_out", "weight"),
        "c_out": ("v_out", "bias"),
        "w_special": ("special", "weight"),
        "b_special": ("special", "bias"),
    }

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The parameters in :func:`rlsched.policy.network.param_shapes` layout (float32)."""
        shapes = param_shapes(self.num_features, self.num_cluster, self.hidden, self.value_hidden)
        out = {}
        for name, (module, attr) in self._NAMES.items():
            t = getattr(getattr(self, module), attr).detach().cpu().numpy().astype(np.float32)
            if attr == "weight":
                t = t.T
            out[name] = np.array(t.reshape(shapes[name]), dtype=np.float32, order="C")
        return out

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Inverse of :meth:`to_arrays`."""
        with torch.no_grad():
            for name, (module, attr) in self._NAMES.items():
                p = getattr(getattr(self, module), attr)
                a = np.asarray(arrays[name], dtype=np.float32)
                if attr == "weight":
                    a = a.reshape(p.shape[1], p.shape[0]).T
                p.copy_(torch.from_numpy(np.array(a, dtype=np.float32, order="C")).reshape(p.shape))

    # -- forward -------------------------------------------------------------------------------
    def forward(self, b: RaggedBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(row scores [R], values [B], special logits [B, 2])."""
        h = torch.tanh(self.l2(torch.tanh(self.l1(b.x))))
        scores = self.prior_scale * b.prior + self.out(h).squeeze(-1)
        n = b.size
        hs = h.shape[1]
        total = torch.zeros(n, dtype=h.dtype).index_add_(0, b.seg, b.count)
        w = (b.count / total[b.seg]).unsqueeze(-1)
        mean = torch.zeros(n, hs, dtype=h.dtype).index_add_(0, b.seg, w * h)
        top = torch.full((n, hs), float("-inf"), dtype=h.dtype).scatter_reduce(
            0, b.seg.unsqueeze(-1).expand(-1, hs), h, reduce="amax", include_self=True
        )
        top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
        pooled = torch.cat([mean, top, b.cluster], dim=1)
        value = self.v_out(torch.tanh(self.v1(pooled))).squeeze(-1)
        special = self.special(pooled)
        return scores, value, special

    def get_action_and_value(
        self, b: RaggedBatch, action: torch.Tensor | None = None, generator: torch.Generator | None = None
    ):
        """(action, log-prob, entropy, value) per decision; samples the action when none is given."""
        scores, value, special = self(b)
        z = scores + b.offset
        zs = torch.where(b.special_mask, special, torch.full_like(special, NEG))
        n = b.size
        top = torch.full((n,), NEG, dtype=z.dtype).scatter_reduce(0, b.seg, z, reduce="amax", include_self=True)
        top = torch.maximum(top, zs.max(dim=1).values).detach()
        sumexp = torch.zeros(n, dtype=z.dtype).index_add_(0, b.seg, torch.exp(z - top[b.seg]))
        sumexp = sumexp + torch.exp(zs - top.unsqueeze(-1)).sum(dim=1)
        log_z = top + torch.log(sumexp)
        p_rows = torch.exp(z - log_z[b.seg])
        p_spec = torch.exp(zs - log_z.unsqueeze(-1))
        mean_z = torch.zeros(n, dtype=z.dtype).index_add_(0, b.seg, p_rows * z) + (p_spec * zs).sum(dim=1)
        entropy = log_z - mean_z
        if action is None:
            action = self._sample(b, z, zs, generator)
        is_row = action >= 0
        row = torch.where(is_row, b.row_start + action.clamp(min=0), torch.zeros_like(action))
        special_idx = (-action - 1).clamp(0, len(SPECIAL_ACTIONS) - 1)
        chosen = torch.where(is_row, z[row], zs.gather(1, special_idx.unsqueeze(-1)).squeeze(-1))
        return action, chosen - log_z, entropy, value

    @staticmethod
    def _sample(b: RaggedBatch, z: torch.Tensor, zs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        out = torch.empty(b.size, dtype=torch.int64)
        counts = torch.bincount(b.seg, minlength=b.size)
        for i in range(b.size):
            start, k = int(b.row_start[i]), int(counts[i])
            logits = torch.cat([z[start : start + k], zs[i]]).detach()
            j = int(torch.multinomial(torch.softmax(logits, 0), 1, generator=generator))
            out[i] = j if j < k else -(j - k) - 1
        return out
