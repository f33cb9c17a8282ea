"""PPO training (torch): the agent, the rollout buffer and the training loop.

Only training imports torch; serving uses :mod:`rlsched.policy.network` and
:mod:`rlsched.policy.learned`. :mod:`.config` (the ``Args``, ``TrainResult``) is torch-free; the rest is imported on
first use.
"""

from __future__ import annotations

import importlib

from .config import Args, TrainResult

_LAZY = {
    "Agent": "agent",
    "RaggedBatch": "agent",
    "RolloutBuffer": "buffer",
    "DecisionRecord": "trainer",
    "train_vine": "vine_trainer",
    "fit_from_records": "trainer",
    "train": "trainer",
}

__all__ = ["Args", "TrainResult", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(name)
