"""FGD-CPU (policy/scorers/fgd_cpu.py) against a pure-Python reference written from its docstring."""

from __future__ import annotations

import math

import numpy as np
import pytest
from ppo_fixtures import filled_state, small_pods, small_typical

from rlsched.policy import Fragmentation, feasible_nodes, make_scorer
from rlsched.policy.scorers.fgd_cpu import CpuFragmentation, FgdCpuScorer


def ref_frag(cards: list[int], cpu_free: int, model_ok: list[bool], typical, cpu_weight: float) -> float:
    total = sum(cards)
    frag = 0.0
    for t in range(len(typical)):
        h, num, cpu, w = (
            int(typical.gpu_milli[t]),
            int(typical.num_gpu[t]),
            int(typical.cpu_milli[t]),
            float(typical.weight[t]),
        )
        if h == 0 or not model_ok[t]:
            frag += w * total
            continue
        fitting = sorted(f for f in cards if f >= h)
        if len(fitting) < num or cpu_free < cpu:
            frag += w * total
            continue
        unusable = sum(f for f in cards if f < h)
        stranded = 0
        if cpu > 0:
            extra = len(fitting) - (cpu_free // cpu) * num
            stranded = sum(fitting[: max(extra, 0)])  # the fitting cards with the least free
        frag += w * (unusable + cpu_weight * stranded)
    return frag


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("cpu_weight", [0.0, 0.8])
def test_node_frag_matches_reference(seed: int, cpu_weight: float) -> None:
    state = filled_state(seed, fills=25)
    typical = small_typical()
    measure = CpuFragmentation(typical, state.model_names, cpu_weight)
    access = typical.access(state.model_names)
    frag = measure.node_frag(state)
    for n in range(state.num_nodes):
        k = int(state.gpu_count[n])
        cards = [int(c) for c in state.card_free[n, :k]]
        expected = ref_frag(cards, int(state.cpu_free[n]), list(access[:, state.model_id[n]]), typical, cpu_weight)
        assert frag[n] == pytest.approx(expected, abs=1e-6)


def test_zero_cpu_weight_is_fgd() -> None:
    state = filled_state(3, fills=30)
    typical = small_typical()
    assert np.allclose(
        CpuFragmentation(typical, state.model_names, 0.0).node_frag(state),
        Fragmentation(typical, state.model_names).node_frag(state),
    )


def test_scores_are_buckets_of_the_delta_and_cards_fit() -> None:
    state = filled_state(1, fills=30)
    scorer = make_scorer("fgd-cpu", small_typical())
    assert isinstance(scorer, FgdCpuScorer)
    for pod in small_pods(30, 7):
        req = state.request(pod)
        nodes = feasible_nodes(state, req)
        if len(nodes) == 0:
            continue
        score, card, delta = scorer.fragmentation(state).placement(state, req, nodes, scorer.step)
        assert (score == np.floor(delta / scorer.step)).all()
        result = scorer.score(state, req, nodes)
        if req.is_share:
            for k, n in enumerate(nodes):
                assert state.card_free[n, result.cards[k]] >= req.gpu_milli
        else:
            assert result.cards is None


def test_step_must_be_positive() -> None:
    with pytest.raises(ValueError, match="step"):
        FgdCpuScorer(small_typical(), step=0)


def test_cpu_starved_cards_count_as_fragment() -> None:
    """A G2-like node with 4 free cards but cpu for one whole-card pod strands 3 cards."""
    from rlsched.policy import ClusterState, NodeSpec, PodSpec
    from rlsched.policy.typical import TypicalPods

    typical = TypicalPods(
        cpu_milli=np.array([12_000]),
        gpu_milli=np.array([1000]),
        num_gpu=np.array([1]),
        gpu_models=((),),
        weight=np.array([1.0]),
    )
    state = ClusterState([NodeSpec("g", 96_000, 1 << 20, 8, "G2")])
    state.place(state.request(PodSpec("big", 80_000, 0, 4, 1000)), 0, (0, 1, 2, 3))
    # 16 cores left feed one 12-core pod: 1 of the 4 free cards is usable, 3 are stranded.
    assert CpuFragmentation(typical, state.model_names, 1.0).node_frag(state)[0] == pytest.approx(3000)
    assert Fragmentation(typical, state.model_names).node_frag(state)[0] == pytest.approx(0)
    assert math.isclose(CpuFragmentation(typical, state.model_names, 0.5).node_frag(state)[0], 1500)


@pytest.mark.parametrize("measure", ["fgd-cpu", "fgd"])
def test_a_node_changed_while_its_row_is_computed_is_computed_again(monkeypatch, measure: str) -> None:
    """The extender runs the model in a worker thread while its event loop may place a pod: a row
    computed before that placement must not be stamped with the node's new version. Deterministic:
    the placement happens inside the kernel call, right after it computed the rows."""
    from rlsched.policy import ClusterState, NodeSpec, PodSpec
    from rlsched.policy import fragmentation as fgd_module
    from rlsched.policy.scorers import fgd_cpu as fgd_cpu_module

    module = fgd_cpu_module if measure == "fgd-cpu" else fgd_module
    typical = small_typical()
    state = ClusterState([NodeSpec("g", 64_000, 262_144, 8, "G2")])
    make = (
        (lambda: CpuFragmentation(typical, state.model_names, 0.8))
        if measure == "fgd-cpu"
        else (lambda: Fragmentation(typical, state.model_names))
    )
    frag = make()
    real = module._frag_rows

    def rows_then_a_bind(*args):
        real(*args)
        monkeypatch.setattr(module, "_frag_rows", real)
        state.place(state.request(PodSpec("meanwhile", 4000, 1000, 1, 500)), 0, (0,))

    monkeypatch.setattr(module, "_frag_rows", rows_then_a_bind)
    frag.node_frag(state)  # computed on the empty node; the pod lands after the rows
    fresh = state.copy()  # a copy starts without caches
    assert frag.node_frag(state)[0] == make().node_frag(fresh)[0]
