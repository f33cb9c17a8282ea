"""Golden tables for Trimaran's TargetLoadPacking and LoadVariationRiskBalancing scorers.

Ported from kubernetes-sigs/scheduler-plugins@903da7df8279 (v0.35.4-devel-37):
``pkg/trimaran/targetloadpacking/targetloadpacking_test.go`` (TestTargetLoadPackingScoring),
``pkg/trimaran/loadvariationriskbalancing/loadvariationriskbalancing_test.go`` (TestScore) and
``.../analysis_test.go`` (TestComputeScore). Each case keeps its Go name; the arithmetic is in the
comment beside the expected value.

Units. Go's nodes are ``1000m`` cpu and ``1Gi`` memory (= 1024 MiB after ``MegaFactor``), and the
load-watcher reports percents; our state holds fractions (``load = percent / 100``) and MiB, which the
scorers turn back into the same numbers. Adaptations, where our pod model cannot say what Go's does:

- Go's ``st.MakePod().Obj()`` has *no containers*, so TargetLoadPacking predicts 0m for it; a trace
  pod is always one container, and one without a cpu request is predicted at the 1000m default. Those
  cases run with ``default_requests_milli_cores=0``, which gives the same 0m and the same arithmetic.
- Go's "excess utilization" pod sets limit = request (predicted at the limit); a trace pod has no
  limits, so that case runs with ``default_requests_multiplier=1`` (predicted = request).
- A pod read from Kubernetes carries its containers (:class:`CpuPrediction`): with it every case runs
  verbatim (``test_target_load_packing_golden_with_the_pods_containers``).
- LoadVariationRiskBalancing reads raw requests (no default for zero), so its cases port verbatim.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlsched.extender.objects import pod_info
from rlsched.extender.settings import GpuConventions
from rlsched.extender.testing import make_pod
from rlsched.policy import ClusterState, NodeSpec, PodSpec
from rlsched.policy.cluster import CpuPrediction
from rlsched.policy.scorers import (
    LoadVariationRiskBalancingScorer,
    NodeScores,
    TargetLoadPackingScorer,
    TieBreak,
    make_scorer,
)
from rlsched.policy.scorers.trimaran import (
    CPU,
    MEMORY,
    go_round,
    predict_cpu_milli,
    predict_cpu_milli_array,
    predict_pod_cpu_milli,
    risk_score,
    set_load_watcher_view,
    target_load_packing_score,
)
from rlsched.policy.typical import typical_pods

NAN = math.nan


def state_with(
    cpu_load: float = NAN,
    cpu_std: float = NAN,
    mem_load: float = NAN,
    mem_std: float = NAN,
    cpu_milli: int = 1000,
    memory_mib: int = 1024,
) -> ClusterState:
    """One node, ``node-1``, 1000m / 1Gi unless told, with the given load (fractions; NaN unknown)."""
    state = ClusterState([NodeSpec("node-1", cpu_milli, memory_mib)])
    state.load[0, CPU], state.load_std[0, CPU] = cpu_load, cpu_std
    state.load[0, MEMORY], state.load_std[0, MEMORY] = mem_load, mem_std
    return state


def score_one(
    scorer: TargetLoadPackingScorer | LoadVariationRiskBalancingScorer, state: ClusterState, pod: PodSpec
) -> int:
    values = scorer.score(state, state.request(pod), np.arange(state.num_nodes)).values
    assert values.dtype.kind == "i", "Trimaran scores are integers (int64(math.Round(...)))"
    return int(values[0])


# -- Go's math.Round -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("x", "expected"),
    [
        (0.5, 1),  # Python's round: 0
        (1.5, 2),
        (2.5, 3),  # Python's round: 2
        (44.5, 45),  # Python's round: 44
        (-0.5, -1),
        (-2.5, -3),
        (0.49999999999999994, 0),  # floor(x + 0.5) would say 1
        (33.333333333333336, 33),
        (0.0, 0),
    ],
)
def test_go_round_is_half_away_from_zero(x: float, expected: int) -> None:
    assert int(go_round(np.array([x]))[0]) == expected


# -- TargetLoadPacking -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cpu_milli", "multiplier", "expected"),
    [
        (0, 1.5, 1000),  # no request, no limit → DefaultRequestsMilliCores
        (1000, 1.5, 1500),  # request, no limit → round(1000 · 1.5)
        (1, 1.5, 2),  # round(1.5) = 2
        (3, 1.5, 5),  # round(4.5) = 5 (half away from zero; Python's round gives 4)
        (1000, 1.0, 1000),  # multiplier 1 stands for limit = request
    ],
)
def test_predict_cpu_milli(cpu_milli: int, multiplier: float, expected: int) -> None:
    assert predict_cpu_milli(cpu_milli, 1000, multiplier) == expected


@pytest.mark.parametrize(
    ("name", "cpu_load", "pod_cpu", "scorer_args", "expected"),
    [
        # Go: pod without containers → 0m; P = 100·(0 + 0)/1000 = 0 ≤ 40
        #     → round((100−40)·0/40 + 40) = 40 (= DefaultTargetUtilizationPercent)
        ("new node", 0.0, 0, {"default_requests_milli_cores": 0}, 40),
        # P = 100·(0.5·1000 + 0)/1000 = 50 > 40 → round(40·(100−50)/(100−40)) = round(33.3) = 33
        ("hot node", 0.5, 0, {"default_requests_milli_cores": 0}, 33),
        # limit = request = 1000m: P = 100·(300 + 1000)/1000 = 130 > 100 → MinNodeScore
        ("excess utilization returns min score", 0.3, 1000, {"default_requests_multiplier": 1.0}, 0),
        # no metrics for the node → MinNodeScore
        ("404 resp from watcher", NAN, 0, {}, 0),
    ],
)
def test_target_load_packing_golden(
    name: str, cpu_load: float, pod_cpu: int, scorer_args: dict[str, float], expected: int
) -> None:
    scorer = TargetLoadPackingScorer(**scorer_args)  # type: ignore[arg-type]
    assert score_one(scorer, state_with(cpu_load), PodSpec("p", pod_cpu, 0)) == expected, name


@pytest.mark.parametrize(
    ("name", "cpu_load", "prediction", "expected"),
    [
        # Go: pod without containers → 0m; P = 0 → 40
        ("new node", 0.0, CpuPrediction(), 40),
        # P = 100·(500 + 0)/1000 = 50 → round(40·50/60) = 33
        ("hot node", 0.5, CpuPrediction(), 33),
        # limit = request = 1000m, predicted at the limit: P = 100·(300 + 1000)/1000 = 130 > 100 → 0
        ("excess utilization returns min score", 0.3, CpuPrediction(1000), 0),
        ("404 resp from watcher", NAN, CpuPrediction(1000), 0),
    ],
)
def test_target_load_packing_golden_with_the_pods_containers(
    name: str, cpu_load: float, prediction: CpuPrediction, expected: int
) -> None:
    """Go's cases verbatim, with Trimaran's defaults: the pod's containers as the extender reads them."""
    pod = PodSpec("p", prediction.limits_milli, 0, cpu_prediction=prediction)
    assert score_one(TargetLoadPackingScorer(), state_with(cpu_load), pod) == expected, name


@pytest.mark.parametrize(
    ("prediction", "default_milli", "multiplier", "expected"),
    [
        (CpuPrediction(), 1000, 1.5, 0),  # no containers: 0m (Go's st.MakePod().Obj())
        (CpuPrediction(8000), 1000, 1.5, 8000),  # limits (and the overhead) as they are
        (CpuPrediction(0, (1000,)), 1000, 1.5, 1500),  # a request without a limit: round(1000 · 1.5)
        (CpuPrediction(0, (3, 3)), 1000, 1.5, 10),  # each rounded: round(4.5) + round(4.5) = 5 + 5, not round(9)
        (CpuPrediction(0, (), 2), 1000, 1.5, 2000),  # neither: DefaultRequestsMilliCores each
        (CpuPrediction(100, (20,), 1), 200, 2.0, 340),  # 100 + round(20 · 2) + 200, the scorer's parameters
    ],
)
def test_predict_pod_cpu_milli(prediction: CpuPrediction, default_milli: int, multiplier: float, expected: int) -> None:
    assert predict_pod_cpu_milli(prediction, default_milli, multiplier) == expected


def test_served_target_load_packing_predicts_a_guaranteed_pod_at_its_limit() -> None:
    """A pod read by the extender with cpu request = limit = 8 (Guaranteed, the usual GPU pod) is
    predicted at its 8000m limit, as Trimaran does, not at 1.5 × its request (12000m), which chose the
    other node: 32-core nodes at 0 % and 15 % cpu; P = 25 % → 78 and P = 40 % → 100 (12000m would give
    P = 37.5 % → 96 and P = 52.5 % → 32)."""
    state = ClusterState([NodeSpec("a", 32_000, 131_072), NodeSpec("b", 32_000, 131_072)])
    state.load[:, CPU] = [0.0, 0.15]
    spec = pod_info(make_pod("p", cpu="8"), GpuConventions()).spec
    assert spec is not None
    values = TargetLoadPackingScorer().score(state, state.request(spec), np.arange(2)).values
    assert values.tolist() == [78, 100]


def test_served_target_load_packing_without_limits_is_the_simulator_s() -> None:
    """Guard: a pod without limits, read by the extender, scores exactly as the trace pod with the same
    request does in the simulator (the replays compare them pod for pod); without a cpu request too."""
    state = ClusterState([NodeSpec(f"n{i}", 4000, 8192) for i in range(4)])
    state.load[:, CPU] = [0.0, 0.1, 0.3, 0.6]
    scorer = TargetLoadPackingScorer()
    for cpu in ("333m", "1", "1500m", None):
        pod = make_pod("p", cpu=cpu or "0", memory="1Gi")
        del pod["spec"]["containers"][0]["resources"]["limits"]
        if cpu is None:
            del pod["spec"]["containers"][0]["resources"]["requests"]["cpu"]
        served = pod_info(pod, GpuConventions()).spec
        assert served is not None and served.cpu_prediction is not None
        trace = PodSpec("p", served.cpu_milli, served.memory_mib)
        got = scorer.score(state, state.request(served), np.arange(4)).values
        assert got.tolist() == scorer.score(state, state.request(trace), np.arange(4)).values.tolist(), cpu


@pytest.mark.parametrize(
    ("name", "cpu_load", "node_cpu", "pod_cpu", "expected"),
    [
        # (ours) 4000m node at 10 %, pod requests 500m: pod = round(500·1.5) = 750;
        # P = 100·(400 + 750)/4000 = 28.75 → round(60·28.75/40 + 40) = round(83.125) = 83
        ("packing below the target", 0.1, 4000, 500, 83),
        # (ours) pod requests 20m → 30m; P = 100·30/1000 = 3 → 60·3/40 + 40 = 44.5 → 45 (not 44)
        ("a half rounds away from zero", 0.0, 1000, 20, 45),
        # (ours) request 0 → 1000m default; P = 100·(0 + 1000)/4000 = 25 → round(60·25/40 + 40) = round(77.5) = 78
        ("no request predicts 1000m", 0.0, 4000, 0, 78),
        # (ours) P = 100·(250 + 150)/1000 = 40 = target → round(60·40/40 + 40) = 100
        ("exactly at the target", 0.25, 1000, 100, 100),
        # (ours) P = 100·(600 + 150)/1000 = 75 → round(40·25/60) = round(16.7) = 17
        ("above the target: spread", 0.6, 1000, 100, 17),
        # (ours) P = 100·(850 + 150)/1000 = 100 → round(40·0/60) = 0
        ("exactly full", 0.85, 1000, 100, 0),
        # (ours) capacity 0: Go leaves P = 0 (guarded division) → round(60·0/40 + 40) = 40
        ("zero capacity", 0.5, 0, 100, 40),
    ],
)
def test_target_load_packing_arithmetic(name: str, cpu_load: float, node_cpu: int, pod_cpu: int, expected: int) -> None:
    scorer = TargetLoadPackingScorer()
    assert score_one(scorer, state_with(cpu_load, cpu_milli=node_cpu), PodSpec("p", pod_cpu, 0)) == expected, name


@pytest.mark.parametrize(
    ("predicted", "target", "expected"),
    [
        (100.0, 100, 100),  # P ≤ T: round(0·100/100 + 100) = 100; no division by 100 − T = 0
        (100.5, 100, 0),  # P > 100 → 0 before any division
        (60.0, 80, 95),  # round((100−80)·60/80 + 80) = round(15 + 80) = 95
        (90.0, 80, 40),  # round(80·(100−90)/(100−80)) = round(40) = 40
        (0.0, 1, 1),  # round(99·0/1 + 1) = 1
    ],
)
def test_target_load_packing_score_targets(predicted: float, target: int, expected: int) -> None:
    assert int(target_load_packing_score(np.array([predicted]), target)[0]) == expected


def test_target_load_packing_scores_only_nodes_with_cpu_load() -> None:
    state = ClusterState([NodeSpec(f"n{i}", 4000, 8192) for i in range(3)])
    state.load[0] = [0.1, 0.5, NAN, NAN]
    state.load[1, MEMORY] = 0.5  # memory alone does not count: TargetLoadPacking needs the cpu metric
    values = TargetLoadPackingScorer().score(state, state.request(PodSpec("p", 500, 0)), np.arange(3)).values
    assert values.tolist() == [83, 0, 0]  # node 0 as in "packing below the target"


# -- LoadVariationRiskBalancing: computeScore --------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "margin", "sensitivity", "capacity", "req", "avg", "std", "expected"),
    [
        # μ = (40 + 10)/100 = 0.5, σ = 0.36^(1/1) · 1 = 0.36 → (1 − 0.86/2)·100 = 57
        ("valid data", 1, 1, 100, 10, 40, 36, 57),
        # capacity ≤ 0 → 0
        ("zero capacity", 1, 2, 0, 10, 40, 36, 0),
        # avg clamped to 0: μ = 0.1, σ = √0.36 = 0.6 → (1 − 0.35)·100 = 65
        ("negative usedAvg", 1, 2, 100, 10, -40, 36, 65),
        # avg clamped to 100: μ = min(110/100, 1) = 1, σ = 0.6 → (1 − 0.8)·100 = 20
        ("large usedAvg", 1, 2, 100, 10, 200, 36, 20),
        # std clamped to 0: μ = 0.5, σ = 0 → (1 − 0.25)·100 = 75
        ("negative usedStdev", 1, 2, 100, 10, 40, -36, 75),
        # std clamped to 100: σ = 1^(1/2) = 1 → (1 − 0.75)·100 = 25
        ("large usedStdev", 1, 2, 100, 10, 40, 120, 25),
        # σ = clamp(−1 · 0.36, 0, 1) = 0 → 75
        ("negative margin", -1, 1, 100, 10, 40, 36, 75),
        # sensitivity < 0: no root, σ = 0.36 → 57
        ("negative sensitivity", 1, -1, 100, 10, 40, 36, 57),
        # sensitivity 0: σ = 0.36^(+Inf) = 0 → 75
        ("zero sensitivity", 1, 0, 100, 10, 40, 36, 75),
    ],
)
def test_compute_score_golden(
    name: str, margin: float, sensitivity: float, capacity: float, req: float, avg: float, std: float, expected: int
) -> None:
    got = risk_score(np.array([capacity]), req, np.array([avg]), np.array([std]), margin, sensitivity)
    assert int(go_round(got)[0]) == expected, name


# -- LoadVariationRiskBalancing: Score ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "load", "pod", "expected"),
    [
        # cpu: A = 1000, avg = 500, req 0 → μ = 0.5, σ = 0 → 75; memory unmeasured → max(75, 0) = 75
        ("new node", {"cpu_load": 0.5}, PodSpec("p", 0, 0), 75),
        # cpu: μ = 1000/1000 = 1 → (1 − 0.5)·100 = 50
        ("hot node", {"cpu_load": 1.0}, PodSpec("p", 0, 0), 50),
        # cpu: μ = (300 + 200)/1000 = 0.5, σ = 0.16 → (1 − 0.33)·100 = 67
        ("average and stDev metrics", {"cpu_load": 0.3, "cpu_std": 0.16}, PodSpec("p", 200, 256), 67),
        # cpu: μ = (400 + 100)/1000 = 0.5, σ = 0.16 → 67;
        # memory: A = 1024 MiB, μ = (512 + 512)/1024 = 1, σ = 0.1 → (1 − 0.55)·100 = 45; min → 45
        (
            "CPU and Memory metrics",
            {"cpu_load": 0.4, "cpu_std": 0.16, "mem_load": 0.5, "mem_std": 0.1},
            PodSpec("p", 100, 512),
            45,
        ),
        # cpu: μ = (800 + 100)/1000 = 0.9, σ = 0.2 → (1 − 0.55)·100 = 45;
        # memory: μ = (256 + 512)/1024 = 0.75, σ = 0.15 → (1 − 0.45)·100 = 55; min → 45
        (
            "pick worst case: CPU or Memory",
            {"cpu_load": 0.8, "cpu_std": 0.2, "mem_load": 0.25, "mem_std": 0.15},
            PodSpec("p", 100, 512),
            45,
        ),
        # no metrics for the node → MinNodeScore
        ("404 resp from watcher", {}, PodSpec("p", 0, 0), 0),
        # (ours) memory alone: μ = (256 + 256)/1024 = 0.5, σ = 0.25 → (1 − 0.375)·100 = 62.5 → 63 (Go rounds up)
        ("memory only, a half rounds up", {"mem_load": 0.25, "mem_std": 0.25}, PodSpec("p", 100, 256), 63),
        # (ours) a std without a mean still counts as measured (GetResourceData: any metric of the type),
        # the mean reading 0: μ = (0 + 100)/1000 = 0.1, σ = 0.2 → (1 − 0.15)·100 = 85
        ("std without average", {"cpu_std": 0.2}, PodSpec("p", 100, 0), 85),
        # (ours) memory capacity 0 with memory measured: its score is 0 and min(cpu, 0) = 0
        ("zero memory capacity", {"cpu_load": 0.5, "mem_load": 0.5}, PodSpec("p", 0, 0), 0),
    ],
)
def test_load_variation_risk_balancing_golden(name: str, load: dict[str, float], pod: PodSpec, expected: int) -> None:
    memory = 0 if name == "zero memory capacity" else 1024
    state = state_with(**load, memory_mib=memory)  # type: ignore[arg-type]
    assert score_one(LoadVariationRiskBalancingScorer(), state, pod) == expected, name


def test_margin_and_sensitivity_change_the_risk() -> None:
    state = state_with(cpu_load=0.4, cpu_std=0.16)
    pod = PodSpec("p", 100, 0)
    # μ = 0.5; margin 2, sensitivity 2: σ = min(2·√0.16, 1) = 0.8 → (1 − 0.65)·100 = 35
    assert score_one(LoadVariationRiskBalancingScorer(2.0, 2.0), state, pod) == 35
    # margin 0: σ = 0 → (1 − 0.25)·100 = 75
    assert score_one(LoadVariationRiskBalancingScorer(0.0, 1.0), state, pod) == 75


# -- missing load, registry, arguments -------------------------------------------------------------


@pytest.mark.parametrize("name", ["target-load-packing", "load-variation-risk-balancing"])
def test_unknown_load_scores_every_node_zero(name: str) -> None:
    """The FGD mode (no load at all): every node gets the minimum score, as Trimaran without metrics."""
    state = ClusterState([NodeSpec(f"n{i}", 4000 * (i + 1), 8192) for i in range(4)])
    values = make_scorer(name).score(state, state.request(PodSpec("p", 500, 512)), np.arange(4)).values
    assert values.tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize(
    ("alias", "cls"),
    [("TargetLoadPacking", TargetLoadPackingScorer), ("LoadVariationRiskBalancing", LoadVariationRiskBalancingScorer)],
)
def test_registered_under_trimaran_names(alias: str, cls: type) -> None:
    assert isinstance(make_scorer(alias), cls)
    assert isinstance(make_scorer(cls.name), cls)


def test_defaults_are_trimarans() -> None:
    tlp, lvrb = TargetLoadPackingScorer(), LoadVariationRiskBalancingScorer()
    assert (tlp.target, tlp.default_milli, tlp.multiplier) == (40, 1000, 1.5)
    assert (lvrb.margin, lvrb.sensitivity) == (1.0, 1.0)


@pytest.mark.parametrize(
    "build",
    [
        lambda: TargetLoadPackingScorer(0),
        lambda: TargetLoadPackingScorer(101),
        lambda: TargetLoadPackingScorer(default_requests_milli_cores=-1),
        lambda: TargetLoadPackingScorer(default_requests_multiplier=-0.5),
        lambda: LoadVariationRiskBalancingScorer(-1.0, 1.0),
        lambda: LoadVariationRiskBalancingScorer(1.0, -1.0),
        lambda: LoadVariationRiskBalancingScorer(math.nan, 1.0),
    ],
)
def test_bad_arguments_are_refused(build: object) -> None:
    with pytest.raises(ValueError):
        build()  # type: ignore[operator]


# -- what load-watcher shows (the living cluster's view) and kube-scheduler's ties -------------------


def test_with_a_load_watcher_view_the_scorers_read_it_not_the_extender_s_load() -> None:
    """The simulator's view (15-minute mean and std, cpu and memory) wins over ``state.load`` /
    ``load_std``, which stay what the feature encoder reads."""
    state = state_with(cpu_load=0.9, cpu_std=0.0, mem_load=0.9, mem_std=0.0)
    pod = PodSpec("p", 0, 0)
    assert score_one(LoadVariationRiskBalancingScorer(), state, pod) == 55  # (1 − 0.9/2)·100
    set_load_watcher_view(state, np.array([[0.2, 0.2]]), np.array([[0.1, 0.3]]), np.zeros(1))
    # cpu: (1 − (0.2 + 0.1)/2)·100 = 85; memory: (1 − (0.2 + 0.3)/2)·100 = 75; the worse decides
    assert score_one(LoadVariationRiskBalancingScorer(), state, pod) == 75
    assert state.load[0, CPU] == 0.9  # untouched

    tlp = ClusterState([NodeSpec("n", 4000, 1024)])
    tlp.load[0, CPU] = 0.9  # not read once a view is there
    set_load_watcher_view(tlp, np.array([[0.05, NAN]]), np.full((1, 2), NAN), np.zeros(1))
    # P = 100·(200 + 1000)/4000 = 30 ≤ 40: round(60·30/40 + 40) = 85
    assert score_one(TargetLoadPackingScorer(), tlp, pod) == 85


@pytest.mark.parametrize(("recent_milli", "expected"), [(0.0, 85), (400.0, 100), (1200.0, 27), (3000.0, 0)])
def test_target_load_packing_adds_the_recently_bound_pods(recent_milli: float, expected: int) -> None:
    """targetloadpacking.go:151-172: the predicted cpu of pods bound since (or < 60 s before) the metrics
    window's end joins ``used + pod``. 4000m node at 5 %: P = 100·(200 + 1000 + recent)/4000."""
    state = ClusterState([NodeSpec("n", 4000, 1024)])
    set_load_watcher_view(state, np.array([[0.05, NAN]]), np.full((1, 2), NAN), np.array([recent_milli]))
    # 400: P = 40 → 100; 1200: P = 60 → round(40·40/60) = 27; 3000: P = 105 > 100 → 0
    assert score_one(TargetLoadPackingScorer(), state, PodSpec("p", 0, 0)) == expected


def test_a_view_predicted_with_other_parameters_is_refused() -> None:
    state = ClusterState([NodeSpec("n", 4000, 1024)])
    set_load_watcher_view(state, np.array([[0.05, NAN]]), np.full((1, 2), NAN), np.zeros(1))
    with pytest.raises(ValueError, match="predicted recently bound pods"):
        TargetLoadPackingScorer(default_requests_multiplier=2.0).score(
            state, state.request(PodSpec("p", 0, 0)), np.arange(1)
        )


def test_predict_cpu_milli_array_agrees_with_the_one_pod_version() -> None:
    requests = np.array([0, 1, 3, 333, 1000, 4001])
    assert predict_cpu_milli_array(requests, 1000, 1.5).tolist() == [
        predict_cpu_milli(int(r), 1000, 1.5) for r in requests
    ]


@pytest.mark.parametrize("name", ["target-load-packing", "load-variation-risk-balancing"])
def test_trimaran_ties_are_kube_scheduler_s_where_the_run_says_so(name: str) -> None:
    """kube-scheduler's selectHost: uniformly random among the top scores, per pod; a seeded stream keeps
    it reproducible. Without that stream (the FGD protocol, the extender) the fixed order stays."""
    scorer = make_scorer(name)
    assert scorer.kube_scheduler_ties
    values, nodes = np.array([7, 9, 9, 3, 9]), np.arange(5)
    fixed = TieBreak.seeded(5, 42)
    assert fixed.ties is None
    first = fixed.argmax(values, nodes)
    assert {scorer.choose(NodeScores(values), nodes, fixed) for _ in range(50)} == {first}

    def picks(seed: int) -> list[int]:
        tiebreak = TieBreak.seeded(5, 42)
        tiebreak.ties = np.random.default_rng(seed)
        return [scorer.choose(NodeScores(values), nodes, tiebreak) for _ in range(3000)]

    drawn = picks(1)
    assert drawn == picks(1)  # reproducible
    counts = np.bincount(drawn, minlength=5)
    assert counts[[0, 3]].tolist() == [0, 0] and all(900 < c < 1100 for c in counts[[1, 2, 4]]), counts


def test_other_scorers_keep_the_fixed_order_even_with_kube_scheduler_s_stream() -> None:
    """The FGD protocol's rule for every scorer that does not stand for a kube-scheduler plugin."""
    tiebreak = TieBreak.seeded(5, 42)
    tiebreak.ties = np.random.default_rng(0)
    values, nodes = np.array([9, 9, 9, 9, 9]), np.arange(5)
    for name in ("fgd", "bestfit", "gpupacking"):
        scorer = make_scorer(name, typical_pods([PodSpec("t", 1000, 1024, 1, 1000)]))
        assert not scorer.kube_scheduler_ties
        assert {scorer.choose(NodeScores(values), nodes, tiebreak) for _ in range(20)} == {
            tiebreak.argmax(values, nodes)
        }


def test_the_simulators_request_cache_keeps_pods_with_other_cpu_predictions_apart() -> None:
    """Two pods alike but for their containers' cpu limits get requests of their own from
    :class:`~rlsched.policy.simulator.RequestCache` (clones share entries by their fields), so each is
    predicted by its own limits."""
    from rlsched.policy.simulator import RequestCache

    state = ClusterState([NodeSpec("a", 32_000, 131_072), NodeSpec("b", 32_000, 131_072)])
    cache = RequestCache(state)
    burstable = PodSpec("p", 8000, 1024)
    guaranteed = PodSpec("q", 8000, 1024, cpu_prediction=CpuPrediction(limits_milli=8000))
    assert cache(burstable).cpu_prediction is None
    assert cache(guaranteed).cpu_prediction == CpuPrediction(limits_milli=8000)
