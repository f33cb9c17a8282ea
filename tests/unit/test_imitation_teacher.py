"""benchmarks/imitation_teacher.py: the teacher's order, its plan replayed under the protocol, and the
behaviour-cloning labels (the candidate group that holds the teacher's node)."""

from __future__ import annotations

from typing import Any

import numpy as np
from benchmark_scripts import load_benchmark
from ppo_fixtures import small_nodes, small_pods, small_typical

from rlsched.policy.cluster import ClusterState, PodSpec
from rlsched.policy.decision import decide
from rlsched.policy.features import FEATURES
from rlsched.policy.learned import SERVED_MODEL, LearnedScorer, load_learned_scorer
from rlsched.policy.scorers.base import TieBreak
from rlsched.policy.simulator import run_sequence
from rlsched.policy.workload import inflate

SEED = 3


def sequence_and_prefix(bench):  # type: ignore[no-untyped-def]
    capacity = ClusterState(small_nodes()).gpu_milli_capacity
    sequence = inflate(small_pods(), capacity, SEED)
    return sequence, bench.prefix_before(sequence, capacity)


def arrival_order_plan() -> tuple[Any, list[PodSpec], LearnedScorer, dict[int, Any]]:
    """The teacher deciding in arrival order on the GPU pods of the prefix (CPU-only pods removed)."""
    bench = load_benchmark("imitation_teacher")
    sequence, prefix = sequence_and_prefix(bench)
    gpu_only = [sequence[i] for i in prefix if sequence[i].gpu_request_milli > 0]
    scorer = load_learned_scorer(SERVED_MODEL, small_typical())
    return bench, gpu_only, scorer, bench.teacher_plan(small_nodes(), gpu_only, range(len(gpu_only)), scorer, SEED)


def test_the_prefix_stops_where_arrivals_reach_100_5_percent() -> None:
    bench = load_benchmark("imitation_teacher")
    sequence, prefix = sequence_and_prefix(bench)
    capacity = ClusterState(small_nodes()).gpu_milli_capacity
    arrived = sum(sequence[i].gpu_request_milli for i in prefix)
    assert prefix == list(range(len(prefix)))
    assert arrived * 100 / capacity < 100.5 <= (arrived + sequence[len(prefix)].gpu_request_milli) * 100 / capacity


def test_the_teacher_places_whole_card_pods_before_shares_and_no_cpu_only_pods() -> None:
    bench = load_benchmark("imitation_teacher")
    sequence, prefix = sequence_and_prefix(bench)
    order = bench.whole_cards_first(sequence, prefix)
    kinds = [sequence[i].is_share for i in order]
    assert kinds == sorted(kinds) and False in kinds and True in kinds
    assert all(sequence[i].gpu_request_milli > 0 for i in order)
    assert {i for i in prefix if sequence[i].gpu_request_milli > 0} == set(order)
    wholes = [i for i in order if not sequence[i].is_share]
    assert wholes == sorted(wholes)


def test_a_plan_in_arrival_order_replays_to_the_simulators_figure() -> None:
    """Teacher order = arrival order (CPU-only pods removed from the sequence): the plan is the model's
    own online schedule, so its replay must measure what the simulator measures."""
    bench, gpu_only, scorer, plan = arrival_order_plan()
    typical = scorer.encoder.typical
    replayed = bench.replay_plan(small_nodes(), gpu_only, range(len(gpu_only)), plan, typical)
    online = run_sequence(small_nodes(), gpu_only, load_learned_scorer(SERVED_MODEL, typical), SEED, typical)
    assert replayed == online.unallocated_at(100)
    assert 0 < len(plan) < len(gpu_only)  # some pods do not fit: the plan leaves them out


def test_the_label_is_the_group_of_the_teachers_node() -> None:
    """With the teacher deciding in arrival order, its decisions are the model's own online ones: each
    label must be the candidate group that holds the node the model chose there."""
    bench, gpu_only, scorer, plan = arrival_order_plan()
    typical = scorer.encoder.typical
    records = bench.imitation_records(small_nodes(), gpu_only, range(len(gpu_only)), plan, scorer, SEED)

    online = load_learned_scorer(SERVED_MODEL, typical)
    state = ClusterState(small_nodes())
    tiebreak = TieBreak.seeded(state.num_nodes, SEED)
    expected = []
    for pod in gpu_only:
        req = state.request(pod)
        decision = decide(online, state, req, tiebreak)
        if decision is None:
            continue
        if len(decision.feasible) > 1:
            assert online.last is not None
            position = int(np.searchsorted(decision.feasible, decision.node))
            expected.append((int(online.last.group[position]), online.last.num_groups))
        state.place(req, decision.node, decision.cards)
    assert len(records) >= 10
    assert [(r.action, len(r.features)) for r in records] == expected


def test_dagger_labels_whole_card_pods_with_the_teachers_choice_in_the_students_states() -> None:
    """Teacher = student: every whole-card pod asked gets the student's own group; every share pod asked
    gets a node that fits it now (the re-plan only adds pods, so its node must be feasible here)."""
    bench = load_benchmark("imitation_teacher")
    sequence, prefix = sequence_and_prefix(bench)
    typical = small_typical()
    student, teacher = load_learned_scorer(SERVED_MODEL, typical), load_learned_scorer(SERVED_MODEL, typical)
    wholes_only = bench.dagger_records(
        small_nodes(), sequence, prefix, student, teacher, SEED, ask_share=0.0, ask_whole=1.0, window=(0.0, 2.0)
    )
    online = load_learned_scorer(SERVED_MODEL, typical)
    state = ClusterState(small_nodes())
    tiebreak = TieBreak.seeded(state.num_nodes, SEED)
    expected = []
    for i in prefix:
        req = state.request(sequence[i])
        decision = decide(online, state, req, tiebreak)
        if decision is None:
            continue
        if req.is_gpu and not req.is_share and len(decision.feasible) > 1:
            assert online.last is not None
            expected.append(int(online.last.group[int(np.searchsorted(decision.feasible, decision.node))]))
        state.place(req, decision.node, decision.cards)
    assert len(expected) >= 5
    assert [r.action for r in wholes_only] == expected

    shares = bench.dagger_records(
        small_nodes(), sequence, prefix, student, teacher, SEED, ask_share=1.0, ask_whole=0.0, window=(0.0, 2.0)
    )
    assert len(shares) >= 5 and all(r.features[0, FEATURES.index("pod_is_share")] == 1.0 for r in shares)
