#!/usr/bin/env python3
"""An imitation warm start (DL2's recipe, arXiv 1909.06040) from a teacher that knows the future.

The teacher knows which pods arrive before 100 % arrival. It places every whole-card pod among them
first, then the share pods, each group in arrival order, with the model itself deciding (CPU-only
pods are left out: they hold no GPU). Replayed in arrival order, that plan is a schedule a scheduler
could have made online if it had guessed the same nodes: every prefix of a feasible set of
placements is feasible. It is measured under the FGD protocol like any policy.

The student is the model's network fitted to the teacher's choices by behaviour cloning: in the
states of the teacher's replay, the candidate group holding the teacher's node is the label, and the
loss is the decision rule's own log-likelihood (prior, network and tie-break offsets, as in
training). It starts from the model and is then judged online, greedy as served, on the evaluation
seeds, against the model and against its own ablation (``ppo-prior:``, the network zeroed).

    python benchmarks/imitation_teacher.py --nodes "$OPENB"/openb_node_list_gpu_node.csv \\
        --pods "$OPENB"/openb_pod_list_default.csv --train-seeds 5000-5039 --eval-seeds 42-51 --json imitation.json

Needs the ``train`` extra (torch) for the fit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from rlsched.policy.cluster import ClusterState, NodeSpec, PodSpec
from rlsched.policy.decision import decide
from rlsched.policy.evaluate import parse_seeds
from rlsched.policy.feasibility import feasible_nodes
from rlsched.policy.learned import SERVED_MODEL, LearnedScorer, load_learned_scorer
from rlsched.policy.network import group_offsets, rank_fraction
from rlsched.policy.scorers.base import TieBreak
from rlsched.policy.simulator import ProtocolMeter, RequestCache, run_fgd_protocol
from rlsched.policy.trace import OPENB_NODES, OPENB_PODS, load_nodes, load_pods, openb_default
from rlsched.policy.typical import TypicalPods, typical_pods
from rlsched.policy.workload import inflate

Plan = dict[int, tuple[int, tuple[int, ...]]]
"""Position in the arrival sequence → (node, cards)."""


def prefix_before(sequence: Sequence[PodSpec], capacity_milli: int, end_pct: float = 100.5) -> list[int]:
    """Positions of the pods that arrive before the arrived GPU demand reaches ``end_pct`` % of
    capacity (the protocol's 100 % point rounds from 99.5 to 100.5)."""
    arrived, out = 0, []
    for i, pod in enumerate(sequence):
        arrived += pod.gpu_request_milli
        if arrived * 100 / capacity_milli >= end_pct:
            break
        out.append(i)
    return out


def whole_cards_first(sequence: Sequence[PodSpec], prefix: Sequence[int]) -> list[int]:
    """The teacher's order: whole-card pods, then share pods, each in arrival order; no CPU-only pods."""
    gpu = [i for i in prefix if sequence[i].gpu_request_milli > 0]
    return sorted(gpu, key=lambda i: (sequence[i].is_share, i))


def teacher_plan(
    nodes: Sequence[NodeSpec], sequence: Sequence[PodSpec], order: Sequence[int], scorer: LearnedScorer, seed: int
) -> Plan:
    """Place the pods at ``order`` in that order with ``scorer``; pods that fit nowhere are left out."""
    state = ClusterState(nodes)
    requests = RequestCache(state)
    tiebreak = TieBreak.seeded(state.num_nodes, seed)
    plan: Plan = {}
    for i in order:
        req = requests(sequence[i])
        decision = decide(scorer, state, req, tiebreak)
        if decision is not None:
            state.place(req, decision.node, decision.cards)
            plan[i] = (decision.node, decision.cards)
    return plan


def replay_plan(
    nodes: Sequence[NodeSpec], sequence: Sequence[PodSpec], prefix: Sequence[int], plan: Plan, typical: TypicalPods
) -> float:
    """The plan in arrival order under the protocol's meter: unallocated GPU % at 100 % arrival."""
    state = ClusterState(nodes)
    requests = RequestCache(state)
    meter = ProtocolMeter(state, typical)
    for i in prefix:
        req = requests(sequence[i])
        if i in plan:
            state.place(req, *plan[i])
        meter.record(req, placed=i in plan)
    return meter.result("teacher", 0, len(prefix), 0.0).unallocated_at(100)


def imitation_records(
    nodes: Sequence[NodeSpec],
    sequence: Sequence[PodSpec],
    prefix: Sequence[int],
    plan: Plan,
    scorer: LearnedScorer,
    seed: int,
    every: int = 1,
) -> list[Any]:
    """Behaviour-cloning records from the plan's replay: for every ``every``-th planned pod with more
    than one feasible node, the candidate rows the student sees and the group holding the teacher's node."""
    state = ClusterState(nodes)
    requests = RequestCache(state)
    tiebreak = TieBreak.seeded(state.num_nodes, seed)
    records, k = [], 0
    for i in prefix:
        if i not in plan:
            continue
        req = requests(sequence[i])
        node, cards = plan[i]
        feasible = feasible_nodes(state, req)
        if len(feasible) > 1 and k % every == 0:
            records.append(record_for(scorer, state, req, feasible, node, tiebreak))
        k += 1
        state.place(req, node, cards)
    return records


def record_for(
    scorer: LearnedScorer, state: ClusterState, req: Any, feasible: np.ndarray, node: int, tiebreak: TieBreak
) -> Any:
    """One behaviour-cloning record: the rows the student sees for ``req`` and the group holding ``node``."""
    from rlsched.policy.ppo.trainer import DecisionRecord

    position = int(np.searchsorted(feasible, node))
    if position == len(feasible) or feasible[position] != node:
        raise ValueError(f"the teacher's node {node} is not feasible in the student's state")
    cand = scorer.encoder.encode(state, req, feasible)
    offsets = group_offsets(cand.group, rank_fraction(tiebreak, feasible), scorer.decision.rank_scale, cand.num_groups)
    return DecisionRecord(
        features=cand.features.copy(),
        prior=cand.prior.astype(np.float32),
        action=int(cand.group[position]),
        count=cand.count.astype(np.float32),
        offset=offsets.astype(np.float32),
    )


def dagger_records(
    nodes: Sequence[NodeSpec],
    sequence: Sequence[PodSpec],
    prefix: Sequence[int],
    student: LearnedScorer,
    teacher: LearnedScorer,
    seed: int,
    ask_share: float,
    ask_whole: float,
    window: tuple[float, float] = (0.3, 1.0),
) -> list[Any]:
    """DAgger labels in the student's own states. The student plays the prefix; inside ``window``
    (arrived GPU as a fraction of capacity) a share pod is labelled, with probability ``ask_share``, by
    the teacher re-planning from that state: it places every whole-card pod still to come, then the
    share pod, and its node is the label. A whole-card pod is labelled, with probability
    ``ask_whole``, by the teacher's choice now (the first pod of its own order)."""
    rng = np.random.default_rng(seed)
    state = ClusterState(nodes)
    requests = RequestCache(state)
    tiebreak = TieBreak.seeded(state.num_nodes, seed)
    teacher_tiebreak = TieBreak.seeded(state.num_nodes, seed)  # same order, its own random stream
    wholes = [i for i in prefix if sequence[i].num_gpu and not sequence[i].is_share]
    capacity, arrived, records = state.gpu_milli_capacity, 0, []
    for i in prefix:
        req = requests(sequence[i])
        arrived += req.gpu_total
        feasible = feasible_nodes(state, req)
        label: int | None = None
        if req.is_gpu and len(feasible) > 1 and window[0] <= arrived / capacity <= window[1]:
            if req.is_share and rng.random() < ask_share:
                ahead = state.copy()
                ahead_requests = RequestCache(ahead)
                for j in wholes:
                    if j > i:
                        later = ahead_requests(sequence[j])
                        placed = decide(teacher, ahead, later, teacher_tiebreak)
                        if placed is not None:
                            ahead.place(later, placed.node, placed.cards)
                choice = decide(teacher, ahead, ahead_requests(sequence[i]), teacher_tiebreak)
                label = None if choice is None else choice.node
            elif not req.is_share and rng.random() < ask_whole:
                choice = decide(teacher, state, req, teacher_tiebreak)
                label = None if choice is None else choice.node
        if label is not None:
            records.append(record_for(student, state, req, feasible, label, tiebreak))
        decision = decide(student, state, req, tiebreak)
        if decision is not None:
            state.place(req, decision.node, decision.cards)
    return records


# -- the runs -------------------------------------------------------------------------------------

_WORLD: dict[str, Any] = {}


def _load(nodes: str, pods: str, model: str) -> None:
    pod_list = load_pods(pods)
    typical = typical_pods(pod_list)
    _WORLD.update(nodes=load_nodes(nodes), pods=pod_list, typical=typical, scorer=load_learned_scorer(model, typical))


def _sequence(seed: int) -> tuple[list[PodSpec], list[int]]:
    capacity = ClusterState(_WORLD["nodes"]).gpu_milli_capacity
    sequence = inflate(_WORLD["pods"], capacity, seed)
    return sequence, prefix_before(sequence, capacity)


def _teacher_on(seed: int) -> tuple[int, float]:
    sequence, prefix = _sequence(seed)
    plan = teacher_plan(_WORLD["nodes"], sequence, whole_cards_first(sequence, prefix), _WORLD["scorer"], seed)
    return seed, replay_plan(_WORLD["nodes"], sequence, prefix, plan, _WORLD["typical"])


def _records_on(job: tuple[int, int]) -> list[Any]:
    seed, every = job
    sequence, prefix = _sequence(seed)
    plan = teacher_plan(_WORLD["nodes"], sequence, whole_cards_first(sequence, prefix), _WORLD["scorer"], seed)
    return imitation_records(_WORLD["nodes"], sequence, prefix, plan, _WORLD["scorer"], seed, every)


def _dagger_on(job: tuple[int, str, float, float]) -> list[Any]:
    seed, student, ask_share, ask_whole = job
    sequence, prefix = _sequence(seed)
    scorer = load_learned_scorer(student, _WORLD["typical"])
    return dagger_records(_WORLD["nodes"], sequence, prefix, scorer, _WORLD["scorer"], seed, ask_share, ask_whole)


def _online(job: tuple[str, bool, int]) -> tuple[str, int, float]:
    model, prior_only, seed = job
    scorer = load_learned_scorer(model, _WORLD["typical"], prior_only=prior_only)
    return (
        model,
        seed,
        run_fgd_protocol(_WORLD["nodes"], _WORLD["pods"], scorer, seed, typical=_WORLD["typical"]).unallocated_at(100),
    )


def fit_student(
    records: list[Any], model: str, out: Path, epochs: int, learning_rate: float, seed: int
) -> dict[str, Any]:
    """Behaviour cloning from ``model``; held-out log-likelihood on the last tenth of the records."""
    import torch

    from rlsched.policy.export import read_model, save_model
    from rlsched.policy.features import CLUSTER_FEATURES, FEATURES
    from rlsched.policy.ppo.agent import Agent
    from rlsched.policy.ppo.config import Args
    from rlsched.policy.ppo.trainer import fit_from_records

    params, manifest, _ = read_model(model)
    net = manifest["network"]
    agent = Agent(
        len(FEATURES), len(CLUSTER_FEATURES), tuple(net["hidden"]), int(net["valueHidden"]), float(net["priorScale"])
    )
    agent.load_arrays(params)
    held = len(records) // 10
    train, test = records[: len(records) - held], records[len(records) - held :]
    before = mean_nll(agent, test)
    torch.set_num_threads(2)
    agent = fit_from_records(train, Args(seed=seed), epochs=epochs, learning_rate=learning_rate, init=agent)
    after = mean_nll(agent, test)
    arrays = agent.to_arrays()
    save_model(out, arrays, {**manifest, "version": f"imitation-{manifest.get('version', 'model')}"})
    return {
        "records": len(records),
        "held_out_nll_before": round(before, 4),
        "held_out_nll_after": round(after, 4),
        "sum_abs_w_out": round(float(np.abs(arrays["w_out"]).sum()), 2),
    }


def mean_nll(agent: Any, records: Sequence[Any]) -> float:
    """Mean −log π(teacher's group) of ``agent`` over ``records``."""
    import torch

    from rlsched.policy.ppo.trainer import records_buffer

    buf = records_buffer(records)
    total = 0.0
    with torch.no_grad():
        for s in range(0, len(records), 2048):
            b, extra = buf.batch(np.arange(s, min(s + 2048, len(records))))
            _, logprob, _, _ = agent.get_action_and_value(b, extra["actions"])
            total += float(-logprob.sum())
    return total / max(len(records), 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", help="node list (default: the openb node list in $RLSCHED_OPENB_DIR)")
    p.add_argument("--pods", help="pod list (default: the openb default trace in $RLSCHED_OPENB_DIR)")
    p.add_argument("--model", default=str(SERVED_MODEL), help="teacher's scorer and the student's start")
    p.add_argument("--train-seeds", default="5000-5039", help="workload seeds of the teacher's demonstrations")
    p.add_argument("--eval-seeds", default="42-51")
    p.add_argument(
        "--labels",
        choices=("replay", "dagger"),
        default="replay",
        help="replay: the teacher's whole plan, in its own states; dagger: the teacher re-plans from the"
        " model's states (one round)",
    )
    p.add_argument("--every", type=int, default=2, help="replay: keep every n-th demonstrated decision")
    p.add_argument("--ask-share", type=float, default=0.1, help="dagger: share pods asked, fraction")
    p.add_argument("--ask-whole", type=float, default=0.05, help="dagger: whole-card pods asked, fraction")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--learning-rate", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", default="runs/imitation/student.npz", help="the student's model file")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    try:
        args.nodes = openb_default(args.nodes, "--nodes", OPENB_NODES)
        args.pods = openb_default(args.pods, "--pods", OPENB_PODS)
    except ValueError as exc:
        p.error(str(exc))

    t0 = time.time()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    eval_seeds, train_seeds = parse_seeds(args.eval_seeds), parse_seeds(args.train_seeds)
    with ProcessPoolExecutor(args.workers, initializer=_load, initargs=(args.nodes, args.pods, args.model)) as pool:
        teacher = dict(pool.map(_teacher_on, eval_seeds))
        print(f"teacher on {len(eval_seeds)} seeds: median {np.median(list(teacher.values())):.3f}", flush=True)
        if args.labels == "replay":
            batches = pool.map(_records_on, [(s, args.every) for s in train_seeds])
        else:
            batches = pool.map(_dagger_on, [(s, args.model, args.ask_share, args.ask_whole) for s in train_seeds])
        records = [r for rs in batches for r in rs]
    fit = fit_student(records, args.model, out, args.epochs, args.learning_rate, args.seed)
    print(f"student fitted: {fit}", flush=True)
    del records
    policies = [(args.model, False), (str(out), False), (str(out), True)]
    names = ["model", "student", "student, network zeroed"]
    with ProcessPoolExecutor(args.workers, initializer=_load, initargs=(args.nodes, args.pods, args.model)) as pool:
        played = list(pool.map(_online, [(m, prior, s) for m, prior in policies for s in eval_seeds]))
    table: dict[str, list[float]] = {"teacher (knows the future)": [teacher[s] for s in eval_seeds]}
    for k, name in enumerate(names):
        table[name] = [played[k * len(eval_seeds) + j][2] for j in range(len(eval_seeds))]
    report(table, eval_seeds)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "args": vars(args),
                    "fit": fit,
                    "seeds": eval_seeds,
                    "unallocated_at_100": table,
                    "minutes": round((time.time() - t0) / 60, 1),
                },
                indent=1,
            )
            + "\n"
        )
    return 0


def report(table: dict[str, list[float]], seeds: Sequence[int]) -> None:
    """Per seed, the median, and seeds better/worse than the first online row (the model)."""
    base = table["model"]
    print("policy".ljust(28) + "".join(f"{s:>7}" for s in seeds) + "  median  better/worse vs model")
    for name, values in table.items():
        wins = sum(v < b for v, b in zip(values, base, strict=True))
        losses = sum(v > b for v, b in zip(values, base, strict=True))
        print(name.ljust(28) + "".join(f"{v:7.3f}" for v in values) + f"  {np.median(values):6.3f}  {wins}/{losses}")


if __name__ == "__main__":
    sys.exit(main())
