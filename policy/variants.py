"""Cluster variants built from a node list: other clusters to adapt a policy to and to test it on.

A policy tuned on one cluster can be wrong on another: the bundled model's hand-set decision rule
was tuned on openb's mix (mostly 8-card G2 and 2-card T4/P100 nodes). These variants keep the
workload and change the cluster, each in one way that a real fleet differs:

- ``eight-cards``: every GPU node has 8 cards, its cpu and memory scaled by ``8 / cards`` so that cpu
  and memory per card stay as they were (a fleet of one server shape);
- ``half``: a random half of the nodes (seeded) — the same mix, half the size;
- ``model-mix``: every GPU node's model drawn uniformly (seeded) from the models that occur with its
  card count, so rare models become common and common ones rarer (model-constrained pods then meet
  another supply);
- ``eight-cards-g2``: every GPU node made openb's commonest 8-card server (96 cores, 384 GiB; the G2
  nodes), its model kept — a fleet of one server shape in which CPU, not cards, runs out first
  (12 cores per card, where openb's 2-card T4 nodes had 52); the hand-set rule of the bundled
  model loses to ``fgd-cpu`` here (docs/ppo.md);
- ``four-times``: every node four times (names suffixed ``-r0`` … ``-r3``, one copy of the whole list
  after another) — the same mix at four times the size, where kube-scheduler's adaptive
  ``percentageOfNodesToScore`` is 12 % instead of 41 % (docs/benchmarks.md).

Workloads are inflated to the variant's own GPU capacity by the FGD protocol, so any pod list runs on
any variant. ``python -m rlsched.policy.variants NODES OUT_DIR`` writes them all as generic node files.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from .cluster import NodeSpec
from .trace import dump_generic, load_nodes, missing_input, output_problem


def eight_cards(nodes: Sequence[NodeSpec], seed: int = 0) -> list[NodeSpec]:
    """Every GPU node with 8 cards; cpu and memory scaled by ``8 / cards`` (per-card shares kept)."""
    out = []
    for n in nodes:
        if n.gpu_count == 0 or n.gpu_count == 8:
            out.append(n)
            continue
        f = 8 / n.gpu_count
        out.append(
            replace(n, cpu_milli=int(round(n.cpu_milli * f)), memory_mib=int(round(n.memory_mib * f)), gpu_count=8)
        )
    return out


def random_half(nodes: Sequence[NodeSpec], seed: int = 0) -> list[NodeSpec]:
    """A random half of the nodes (rounded up), in their original order."""
    keep = np.sort(np.random.default_rng(seed).permutation(len(nodes))[: (len(nodes) + 1) // 2])
    return [nodes[i] for i in keep]


def model_mix(nodes: Sequence[NodeSpec], seed: int = 0) -> list[NodeSpec]:
    """Each GPU node's model drawn uniformly from the models seen with its card count."""
    models: dict[int, list[str]] = defaultdict(list)
    for n in nodes:
        if n.gpu_count and n.gpu_model not in models[n.gpu_count]:
            models[n.gpu_count].append(n.gpu_model)
    rng = np.random.default_rng(seed)
    return [replace(n, gpu_model=str(rng.choice(models[n.gpu_count]))) if n.gpu_count else n for n in nodes]


G2_CPU_MILLI, G2_MEMORY_MIB = 96_000, 393_216
"""openb's commonest 8-card node (549 of 1,213 nodes): 96 cores, 384 GiB."""


def eight_cards_g2(nodes: Sequence[NodeSpec], seed: int = 0) -> list[NodeSpec]:
    """Every GPU node with 8 cards, 96 cores and 384 GiB (openb's G2 shape), its model kept."""
    return [
        replace(n, gpu_count=8, cpu_milli=G2_CPU_MILLI, memory_mib=G2_MEMORY_MIB) if n.gpu_count else n for n in nodes
    ]


def four_times(nodes: Sequence[NodeSpec], seed: int = 0) -> list[NodeSpec]:
    """Every node four times: the list with names suffixed ``-r0``, then ``-r1``, ``-r2``, ``-r3``."""
    return [replace(n, name=f"{n.name}-r{copy}") for copy in range(4) for n in nodes]


VARIANTS: dict[str, Callable[[Sequence[NodeSpec], int], list[NodeSpec]]] = {
    "eight-cards": eight_cards,
    "half": random_half,
    "model-mix": model_mix,
    "eight-cards-g2": eight_cards_g2,
    "four-times": four_times,
}
"""Variant name → builder ``(nodes, seed) → nodes``."""


def make_variant(name: str, nodes: Sequence[NodeSpec], seed: int = 0) -> list[NodeSpec]:
    if name not in VARIANTS:
        raise ValueError(f"unknown cluster variant {name!r}; choose one of {', '.join(VARIANTS)}")
    return VARIANTS[name](nodes, seed)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rlsched.policy.variants", description="write the cluster variants of a node list"
    )
    p.add_argument("nodes", help="node list (openb CSV or generic YAML/JSON)")
    p.add_argument("out_dir", help="folder for <variant>.json (generic format, usable as --nodes)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random variants (default: %(default)s)")
    args = p.parse_args(argv)
    try:
        write_variants(args.nodes, args.out_dir, args.seed)
    except ValueError as exc:  # TraceError too
        print(f"variants: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"variants: {exc.filename or args.out_dir}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


def write_variants(nodes_path: str, out_dir: str, seed: int) -> None:
    """Write every variant of the node list at ``nodes_path`` into ``out_dir`` as ``<variant>.json``.
    ValueError, naming the argument, for a seed numpy refuses, a node list that cannot be read or an
    output folder that cannot be made; checked before anything is written."""
    if not 0 <= seed <= 2**63 - 1:
        raise ValueError(f"--seed must be a whole number from 0 to 2**63 - 1, got {seed}")
    if not Path(nodes_path).is_file():
        raise ValueError(missing_input(nodes_path, "nodes"))
    problem = output_problem(out_dir, "out_dir", folder=True)
    if problem:
        raise ValueError(problem)
    nodes = load_nodes(nodes_path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in VARIANTS:
        path = out / f"{name}.json"
        variant = make_variant(name, nodes, seed)
        path.write_text(dump_generic(variant, []))
        print(f"{path}: {len(variant)} nodes, {sum(n.gpu_count for n in variant)} GPUs")


if __name__ == "__main__":
    sys.exit(main())
