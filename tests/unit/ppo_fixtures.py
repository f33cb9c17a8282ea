"""Small synthetic clusters and workloads for the PPO tests (test_env, test_features, test_network,
test_learned, test_train_smoke, test_ppo_*): fast, and independent of the openb files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rlsched.policy import ClusterState, NodeSpec, PodSpec, default_cards, feasible_nodes
from rlsched.policy.ppo.config import Args
from rlsched.policy.trace import dump_generic
from rlsched.policy.typical import TypicalPods, typical_pods


def small_nodes() -> list[NodeSpec]:
    """12 nodes of four kinds (8-card G2-like, 2-card T4-like, 4-card V100, one CPU-only)."""
    nodes = [NodeSpec(f"g2-{i}", 96_000, 393_216, 8, "G2") for i in range(5)]
    nodes += [NodeSpec(f"t4-{i}", 104_000, 524_288, 2, "T4") for i in range(4)]
    nodes += [NodeSpec(f"v100-{i}", 32_000, 131_072, 4, "V100M16") for i in range(2)]
    nodes.append(NodeSpec("cpu-0", 64_000, 262_144))
    return nodes


def small_pods(n: int = 80, seed: int = 0) -> list[PodSpec]:
    """A mixed workload: share pods, whole-card pods (some model-constrained), CPU-only pods."""
    rng = np.random.default_rng(seed)
    pods = []
    for i in range(n):
        kind = rng.random()
        cpu = int(rng.choice([1000, 4000, 8000, 12000, 16000]))
        mem = int(rng.choice([4096, 16384, 49152]))
        if kind < 0.15:
            pods.append(PodSpec(f"cpu-{i:03d}", cpu, mem))
        elif kind < 0.65:
            pods.append(PodSpec(f"share-{i:03d}", cpu, mem, 1, int(rng.choice([250, 470, 500, 650, 810]))))
        else:
            models = ("V100M16",) if rng.random() < 0.1 else ()
            pods.append(PodSpec(f"whole-{i:03d}", cpu, mem, int(rng.choice([1, 1, 2, 4])), 1000, models))
    return pods


def small_typical() -> TypicalPods:
    return typical_pods(small_pods())


def filled_state(seed: int = 0, fills: int = 30) -> ClusterState:
    """The small cluster after ``fills`` random placements (through place(), so arrays stay consistent)."""
    rng = np.random.default_rng(seed)
    state = ClusterState(small_nodes())
    for pod in small_pods(fills, seed + 100):
        req = state.request(pod)
        fits = feasible_nodes(state, req)
        if len(fits):
            n = int(rng.choice(fits))
            if req.is_share:
                card = int(rng.choice(np.flatnonzero(state.card_free[n, : state.gpu_count[n]] >= req.gpu_milli)))
                state.place(req, n, (card,))
            else:
                state.place(req, n, default_cards(state, req, n))
    return state


def write_workload(folder: Path) -> tuple[str, str]:
    """The small cluster and workload as generic-format files; returns (nodes path, pods path)."""
    doc = dump_generic(small_nodes(), small_pods())
    folder.mkdir(parents=True, exist_ok=True)
    nodes_path = folder / "cluster.json"
    nodes_path.write_text(doc)
    return str(nodes_path), str(nodes_path)


def tiny_args(folder: Path, **kw: Any) -> Args:
    """Settings of a PPO run on the small cluster that takes a second or two (``kw`` overrides)."""
    nodes, pods = write_workload(folder)
    base: dict[str, Any] = dict(
        exp_name="tiny",
        seed=3,
        nodes=nodes,
        traces=(pods,),
        num_envs=2,
        num_steps=32,
        total_timesteps=256,
        num_minibatches=2,
        update_epochs=2,
        hidden=(16, 16),
        value_hidden=16,
        end_at=1.0,
        learn_from=0.3,
        eval_every=2,
        checkpoint_every=100,
        val_seeds=(5,),
        out_dir=str(folder / "runs"),
        progress=False,
        rank_scale=20.0,
        workers=1,
    )
    base.update(kw)
    return Args(**base)
