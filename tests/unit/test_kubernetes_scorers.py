"""Golden tables for Kubernetes' NodeResourcesFit / BalancedAllocation scoring, kube-scheduler v1.37.2.

Ported from ``pkg/scheduler/framework/plugins/noderesources/{least_allocated,most_allocated,
balanced_allocation}_test.go`` (k8s.io/kubernetes@v1.37.2). Each case keeps its Go name and the
arithmetic is written out next to the expected value.

Units. The Go tables write cpu either in cores (``"cpu": "4000"`` = 4000 cores) or in millicores
(``makeNode(.., 4000, ..)``, ``"1000m"``), and memory in *bytes* (``"memory": "10000"``). Our model
counts millicores and MiB (the scorer multiplies MiB by 2**20). Every score is a ratio of a request to
an allocatable of the same resource, and scaling both by the same factor (×1/1000 for cores given as
plain numbers, ×2**20 for bytes read as MiB) leaves ``x·100 // A`` and the balance fractions exactly
unchanged, so the numbers are taken over as they are: "4000" cores → 4000 m, "10000" bytes → 10000 MiB.
That holds while no nonzero default (100m / 200 MiB) enters, which is the case for every case ported
verbatim below.

What our model cannot say, and how it is handled:

- A pod with *no containers* (``st.MakePod().Obj()``) and an *explicit* ``"memory": "0"`` request both
  count as 0 in Go, while our ``PodSpec`` has one implicit container and a 0 request means "not set",
  which Least/MostAllocated count as the nonzero default (100m cpu, 200 MiB memory, as Go does for a
  container without requests: ``Container("container")``). Those cases are ported *adapted*: same
  nodes and pods, our semantics, expected values recomputed by hand (the Go value is given alongside).
  BalancedAllocation uses actual requests (``useRequested``), so explicit zeros port verbatim there.
- Go's extended resource (``abc.com/xyz``, ``nvidia.com/gpu``) is our ``gpu`` resource: n devices are n
  cards = n × 1000 milli; a pod asking n devices asks n whole cards.
- Not ported (no counterpart in our model): DRA-backed extended resources, the "PreScore not called"
  variants (we have no separate PreScore; the score is the same function), the ``fwk.Error`` status
  of "Resources not set" (we port its score, 0), and "resource with zero weight" (our
  :class:`ResourceWeights` documents weight 0 as "leave the resource out", see
  :func:`test_zero_weight_leaves_resource_out`). Ephemeral storage and pod-level resources do not
  appear in these three files' tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from rlsched.policy import ClusterState, NodeSpec, PodSpec, default_cards
from rlsched.policy.scorers import (
    BalancedAllocationScorer,
    LeastAllocatedScorer,
    MostAllocatedScorer,
    ResourceWeights,
)

CPU_MEM = {"cpu": 1, "memory": 1}
"""Go's ``defaultResources``."""
EXTENDED = {"cpu": 1, "memory": 1, "gpu": 1}
"""Go's ``extendedResourceSet`` (abc.com/xyz → gpu)."""


def node(name: str, cpu: int, mem: int, gpus: int = 0) -> NodeSpec:
    return NodeSpec(name, cpu, mem, gpus, "GPU" if gpus else "")


def pod(cpu: int, mem: int, gpus: int = 0) -> PodSpec:
    return PodSpec("pod", cpu, mem, gpus, 1000 if gpus else 0)


@dataclass
class Case:
    nodes: list[NodeSpec]
    pod: PodSpec
    existing: list[tuple[str, PodSpec]] = field(default_factory=list)
    weights: dict[str, int] = field(default_factory=lambda: dict(CPU_MEM))


def run_case(scorer_cls, case: Case) -> list[int]:
    """Build the state with place() (so the node "requested" numbers come from the model) and score every node."""
    state = ClusterState(case.nodes)
    for node_name, spec in case.existing:
        req = state.request(spec)
        n = state.index[node_name]
        state.place(req, n, default_cards(state, req, n))
    scorer = scorer_cls(ResourceWeights(dict(case.weights)))
    values = scorer.score(state, state.request(case.pod), np.arange(state.num_nodes)).values
    assert values.dtype.kind == "i", "Kubernetes scores are integers"
    return [int(v) for v in values]


# -- LeastAllocated ------------------------------------------------------------------------------------

LEAST_ALLOCATED = [
    pytest.param(
        # Adapted (Go: pod without containers → 100, 100). Our pod (0, 0) counts 100m / 200Mi:
        # CPU: (4000 - 100) * 100 // 4000 = 97;  Memory: (10000 - 200) * 100 // 10000 = 98
        # Node1 = Node2 = (97 + 98) // 2 = 97
        Case([node("node1", 4000, 10000), node("node2", 4000, 10000)], pod(0, 0)),
        [97, 97],
        id="nothing scheduled, nothing requested (adapted)",
    ),
    pytest.param(
        # Node1: CPU ((4000 - 3000) * 100) // 4000 = 25; Memory ((10000 - 5000) * 100) // 10000 = 50
        #        (25 + 50) // 2 = 37
        # Node2: CPU ((6000 - 3000) * 100) // 6000 = 50; Memory 50 → (50 + 50) // 2 = 50
        # (Go's pod has two containers, 1000+2000 and 2000+3000: one pod of 3000, 5000 here.)
        Case([node("node1", 4000, 10000), node("node2", 6000, 10000)], pod(3000, 5000)),
        [37, 50],
        id="nothing scheduled, resources requested, differently sized nodes",
    ),
    pytest.param(
        # No resources configured: every node scores MinNodeScore (Go also returns an Error status).
        Case([node("node1", 4000, 10000), node("node2", 6000, 10000)], pod(3000, 5000), weights={}),
        [0, 0],
        id="Resources not set, pods scheduled with error",
    ),
    pytest.param(
        # Adapted (Go: pods without containers → 100, 100). Two existing (0, 0) pods per node and the
        # pod itself each count 100m / 200Mi: requested cpu 300, memory 600.
        # CPU: (4000 - 300) * 100 // 4000 = 92;  Memory: (10000 - 600) * 100 // 10000 = 94
        # (92 + 94) // 2 = 93
        Case(
            [node("node1", 4000, 10000), node("node2", 4000, 10000)],
            pod(0, 0),
            [("node1", pod(0, 0)), ("node1", pod(0, 0)), ("node2", pod(0, 0)), ("node2", pod(0, 0))],
        ),
        [93, 93],
        id="no resources requested, pods scheduled (adapted)",
    ),
    pytest.param(
        # Adapted (Go: 70, 57 with explicit memory "0"). Our memory 0 counts 200Mi, the pod 100m/200Mi.
        # Node1: CPU (10000 - 6100) * 100 // 10000 = 39; Memory (20000 - 600) * 100 // 20000 = 97
        #        (39 + 97) // 2 = 68
        # Node2: CPU 39; Memory (20000 - 5400) * 100 // 20000 = 73 → (39 + 73) // 2 = 56
        Case(
            [node("node1", 10000, 20000), node("node2", 10000, 20000)],
            pod(0, 0),
            [("node1", pod(3000, 0)), ("node1", pod(3000, 0)), ("node2", pod(3000, 0)), ("node2", pod(3000, 5000))],
        ),
        [68, 56],
        id="no resources requested, pods scheduled with resources (adapted)",
    ),
    pytest.param(
        # Adapted (Go: 57, 45; the 200Mi default does not change the result).
        # Node1: CPU ((10000 - 6000) * 100) // 10000 = 40; Memory ((20000 - 5200) * 100) // 20000 = 74
        #        (40 + 74) // 2 = 57
        # Node2: CPU 40; Memory ((20000 - 10000) * 100) // 20000 = 50 → (40 + 50) // 2 = 45
        Case(
            [node("node1", 10000, 20000), node("node2", 10000, 20000)],
            pod(3000, 5000),
            [("node1", pod(3000, 0)), ("node2", pod(3000, 5000))],
        ),
        [57, 45],
        id="resources requested, pods scheduled with resources (adapted)",
    ),
    pytest.param(
        # Adapted (Go: 57, 60; same result).
        # Node1: as above, 57
        # Node2: CPU 40; Memory ((50000 - 10000) * 100) // 50000 = 80 → (40 + 80) // 2 = 60
        Case(
            [node("node1", 10000, 20000), node("node2", 10000, 50000)],
            pod(3000, 5000),
            [("node1", pod(3000, 0)), ("node2", pod(3000, 5000))],
        ),
        [57, 60],
        id="resources requested, pods scheduled with resources, differently sized nodes (adapted)",
    ),
    pytest.param(
        # Adapted (Go: 50, 25). The pod (3000, 0) asks 200Mi by default.
        # Node1: CPU 6000 > 4000 → 0; Memory (10000 - 200 - 200) * 100 // 10000 = 96 → (0 + 96) // 2 = 48
        # Node2: CPU 0; Memory (10000 - 5000 - 200) * 100 // 10000 = 48 → (0 + 48) // 2 = 24
        Case(
            [node("node1", 4000, 10000), node("node2", 4000, 10000)],
            pod(3000, 0),
            [("node1", pod(3000, 0)), ("node2", pod(3000, 5000))],
        ),
        [48, 24],
        id="requested resources exceed node capacity (adapted)",
    ),
    pytest.param(
        # Nodes without capacity: every resource has allocatable 0 and is skipped → MinNodeScore.
        # (Go's existing pods are left out: our place() refuses to oversubscribe, and with every
        # resource skipped they cannot change the score.)
        Case([node("node1", 0, 0), node("node2", 0, 0)], pod(0, 0)),
        [0, 0],
        id="zero node resources, pods scheduled with resources",
    ),
    pytest.param(
        # Node1: CPU 25, Memory 50 → (25 * 1 + 50 * 2) // (1 + 2) = 125 // 3 = 41
        # Node2: CPU 50, Memory 50 → (50 * 1 + 50 * 2) // 3 = 50
        Case(
            [node("node1", 4000, 10000), node("node2", 6000, 10000)], pod(3000, 5000), weights={"memory": 2, "cpu": 1}
        ),
        [41, 50],
        id="nothing scheduled, resources requested with different weight on CPU and memory",
    ),
    pytest.param(
        # The pod asks no gpu, so gpu is left out even where the node has cards:
        # Node1 = Node2 = (50 + 50) // 2 = 50
        Case([node("node1", 6000, 10000), node("node2", 6000, 10000, gpus=4)], pod(3000, 5000), weights=EXTENDED),
        [50, 50],
        id="bypass extended resource if the pod does not request",
    ),
    pytest.param(
        # Pod asks 2 cards (2000 milli). CPU and memory score 50 on both nodes.
        # Node1 gpu: (4000 - 2000) * 100 // 4000 = 50 → (50 + 50 + 50) // 3 = 50
        # Node2 gpu: (10000 - 2000) * 100 // 10000 = 80 → (50 + 50 + 80) // 3 = 60
        Case(
            [node("node1", 6000, 10000, gpus=4), node("node2", 6000, 10000, gpus=10)],
            pod(3000, 5000, gpus=2),
            weights=EXTENDED,
        ),
        [50, 60],
        id="honor extended resource if the pod requests",
    ),
    pytest.param(
        # CPU ((6000 - 3000) * 100) // 6000 = 50; Memory ((10000 - 4000) * 100) // 10000 = 60
        # gpu (weight 2) not requested → (50 * 1 + 60 * 1) // (1 + 1) = 55 on both nodes
        Case(
            [node("node1", 6000, 10000), node("node2", 6000, 10000, gpus=4)],
            pod(3000, 4000),
            weights={"gpu": 2, "cpu": 1, "memory": 1},
        ),
        [55, 55],
        id="if the node doesn't have a resource",
    ),
]


@pytest.mark.parametrize("case, expected", LEAST_ALLOCATED)
def test_least_allocated(case: Case, expected: list[int]) -> None:
    assert run_case(LeastAllocatedScorer, case) == expected


# -- MostAllocated -------------------------------------------------------------------------------------

MOST_ALLOCATED = [
    pytest.param(
        # Adapted (Go: pod without containers → 0, 0). Our pod (0, 0) counts 100m / 200Mi:
        # CPU: 100 * 100 // 4000 = 2; Memory: 200 * 100 // 10000 = 2 → (2 + 2) // 2 = 2
        Case([node("node1", 4000, 10000), node("node2", 4000, 10000)], pod(0, 0)),
        [2, 2],
        id="nothing scheduled, nothing requested (adapted)",
    ),
    pytest.param(
        # Node1: CPU (3000 * 100) // 4000 = 75; Memory (5000 * 100) // 10000 = 50 → (75 + 50) // 2 = 62
        # Node2: CPU (3000 * 100) // 6000 = 50; Memory 50 → (50 + 50) // 2 = 50
        Case([node("node1", 4000, 10000), node("node2", 6000, 10000)], pod(3000, 5000)),
        [62, 50],
        id="nothing scheduled, resources requested, differently sized nodes",
    ),
    pytest.param(
        # No resources configured → MinNodeScore (Go also returns an Error status).
        Case([node("node1", 4000, 10000), node("node2", 6000, 10000)], pod(3000, 5000), weights={}),
        [0, 0],
        id="Resources not set, pods scheduled with error",
    ),
    pytest.param(
        # Adapted (Go: 30, 42 with explicit memory "0" and a pod without containers).
        # Node1: CPU (6000 + 100) * 100 // 10000 = 61; Memory (200 + 200 + 200) * 100 // 20000 = 3
        #        (61 + 3) // 2 = 32
        # Node2: CPU 61; Memory (200 + 5000 + 200) * 100 // 20000 = 27 → (61 + 27) // 2 = 44
        Case(
            [node("node1", 10000, 20000), node("node2", 10000, 20000)],
            pod(0, 0),
            [("node1", pod(3000, 0)), ("node1", pod(3000, 0)), ("node2", pod(3000, 0)), ("node2", pod(3000, 5000))],
        ),
        [32, 44],
        id="no resources requested, pods scheduled with resources (adapted)",
    ),
    pytest.param(
        # Adapted (Go: 42, 55).
        # Node1: CPU (6000 * 100) // 10000 = 60; Memory ((200 + 5000) * 100) // 20000 = 26 → (60 + 26) // 2 = 43
        # Node2: CPU 60; Memory (10000 * 100) // 20000 = 50 → (60 + 50) // 2 = 55
        Case(
            [node("node1", 10000, 20000), node("node2", 10000, 20000)],
            pod(3000, 5000),
            [("node1", pod(3000, 0)), ("node2", pod(3000, 5000))],
        ),
        [43, 55],
        id="resources requested, pods scheduled with resources (adapted)",
    ),
    pytest.param(
        # Node1: CPU 5000 * 100 // 5000 = 100; Memory (9000 * 100) // 10000 = 90 → (100 + 90) // 2 = 95
        # Node2: CPU (5000 * 100) // 10000 = 50; Memory 9000 * 100 // 9000 = 100 → (50 + 100) // 2 = 75
        Case([node("node1", 5000, 10000), node("node2", 10000, 9000)], pod(5000, 9000)),
        [95, 75],
        id="resources requested equal node capacity",
    ),
    pytest.param(
        # Node1: CPU (3000 * 100) // 4000 = 75; Memory 50 → (75 * 1 + 50 * 2) // (1 + 2) = 175 // 3 = 58
        # Node2: CPU 50; Memory 50 → (50 * 1 + 50 * 2) // 3 = 50
        Case(
            [node("node1", 4000, 10000), node("node2", 6000, 10000)], pod(3000, 5000), weights={"memory": 2, "cpu": 1}
        ),
        [58, 50],
        id="nothing scheduled, resources requested, differently sized nodes, weights",
    ),
    pytest.param(
        # Verbatim (units match: 250m, 1000Mi; pods with a container without requests = our (0, 0)).
        # Node1: CPU (100 + 100 + 100) = 300 > 250 → capped: 250 * 100 // 250 = 100
        #        Memory 600 * 100 // 1000 = 60 → (100 + 60) // 2 = 80
        # Node2: CPU 100 * 100 // 250 = 40; Memory 200 * 100 // 1000 = 20 → (40 + 20) // 2 = 30
        Case(
            [node("node1", 250, 1000), node("node2", 250, 1000)],
            pod(0, 0),
            [("node1", pod(0, 0)), ("node1", pod(0, 0))],
        ),
        [80, 30],
        id="no resources requested, pods scheduled, nonzero request for resource",
    ),
    pytest.param(
        # gpu not requested → left out: (50 + 50) // 2 = 50 on both nodes
        Case([node("node1", 6000, 10000), node("node2", 6000, 10000, gpus=4)], pod(3000, 5000), weights=EXTENDED),
        [50, 50],
        id="bypass extended resource if the pod does not request",
    ),
    pytest.param(
        # CPU and memory 50 on both. Node1 gpu 2000 * 100 // 4000 = 50 → (50 + 50 + 50) // 3 = 50
        # Node2 gpu 2000 * 100 // 10000 = 20 → (50 + 50 + 20) // 3 = 40
        Case(
            [node("node1", 6000, 10000, gpus=4), node("node2", 6000, 10000, gpus=10)],
            pod(3000, 5000, gpus=2),
            weights=EXTENDED,
        ),
        [50, 40],
        id="honor extended resource if the pod request",
    ),
    pytest.param(
        # CPU (3000 * 100) // 6000 = 50; Memory (4000 * 100) // 10000 = 40 → (50 + 40) // 2 = 45
        Case(
            [node("node1", 6000, 10000), node("node2", 6000, 10000, gpus=4)],
            pod(3000, 4000),
            weights={"gpu": 2, "cpu": 1, "memory": 1},
        ),
        [45, 45],
        id="if the node doesn't have a resource",
    ),
]


@pytest.mark.parametrize("case, expected", MOST_ALLOCATED)
def test_most_allocated(case: Case, expected: list[int]) -> None:
    assert run_case(MostAllocatedScorer, case) == expected


# -- BalancedAllocation (v1.34+: scores the change in balance) -----------------------------------------
# score = 50 + (50 + b(with pod) - b(without pod)) // 2,  b(x) = int((1 - std(fractions)) * 100)
# with two resources std = |f1 - f2| / 2. Actual requests (no nonzero defaults).

BALANCED = [
    pytest.param(
        # Best-effort pod: Go's PreScore returns Skip (the plugin does not score); we score 0 everywhere.
        Case([node("node1", 4000, 10000), node("node2", 4000, 10000)], pod(0, 0)),
        [0, 0],
        id="nothing scheduled, nothing requested, skip in PreScore",
    ),
    pytest.param(
        # Node1: CPU 0 -> 3000/4000 (0 -> .75), Memory 0 -> 5000/10000 (0 -> .5)
        #        b: 100 -> int((1 - .125) * 100) = 87;  50 + (50 + 87 - 100) // 2 = 50 + 18 = 68
        # Node2: CPU 0 -> .5, Memory 0 -> .5; b: 100 -> 100;  50 + 50 // 2 = 75
        Case([node("node1", 4000, 10000), node("node2", 6000, 10000)], pod(3000, 5000)),
        [68, 75],
        id="nothing scheduled, resources requested, differently sized nodes",
    ),
    pytest.param(
        # Node1: CPU .3 -> .6, Memory 0 -> .25; b: 85 -> 82;  50 + (50 + 82 - 85) // 2 = 50 + 23 = 73
        # Node2: CPU .3 -> .6, Memory .25 -> .5; b: 97 -> 95;  50 + (50 + 95 - 97) // 2 = 50 + 24 = 74
        Case(
            [node("node1", 10000, 20000), node("node2", 10000, 20000)],
            pod(3000, 5000),
            [("node1", pod(3000, 0)), ("node2", pod(3000, 5000))],
        ),
        [73, 74],
        id="resources requested, pods scheduled with resources",
    ),
    pytest.param(
        # Node1: as above, 73
        # Node2: CPU .3 -> .6, Memory 5000/50000 .1 -> .2; b: 90 -> 80;  50 + (50 + 80 - 90) // 2 = 70
        Case(
            [node("node1", 10000, 20000), node("node2", 10000, 50000)],
            pod(3000, 5000),
            [("node1", pod(3000, 0)), ("node2", pod(3000, 5000))],
        ),
        [73, 70],
        id="resources requested, pods scheduled with resources, differently sized nodes",
    ),
    pytest.param(
        # Pod asks memory only (cpu 0).
        # Node1: CPU 3000/3000 1 -> 1, Memory 0 -> 1; b: 50 -> 100;  50 + (50 + 100 - 50) // 2 = 100
        # Node2: CPU 0 -> 0, Memory 0 -> 1; b: 100 -> 50;  50 + (50 + 50 - 100) // 2 = 50
        Case([node("node1", 3000, 5000), node("node2", 3000, 5000)], pod(0, 5000), [("node1", pod(3000, 0))]),
        [100, 50],
        id="resources requested, pods scheduled with resources, nodes to reach min/max score",
    ),
    pytest.param(
        # Node1: CPU .5 -> 1, Memory 0 -> 0; b: 75 -> 50;  50 + (50 + 50 - 75) // 2 = 50 + 12 = 62
        # Node2: CPU .5 -> 1, Memory .5 -> .5; b: 100 -> 75;  50 + (50 + 75 - 100) // 2 = 62
        Case(
            [node("node1", 6000, 10000), node("node2", 6000, 10000)],
            pod(3000, 0),
            [("node1", pod(3000, 0)), ("node2", pod(3000, 5000))],
        ),
        [62, 62],
        id="requested resources at node capacity",
    ),
    pytest.param(
        # Three resources: std = sqrt(Σ (f - mean)² / 3). Pod asks 1 card (cpu 0, memory 0).
        # Node1: CPU 3000/3500 = .857, Memory 5000/40000 = .125, GPU 3000/8000 .375 -> .5
        #        without: mean .4524, std .3039 → b = 69;  with: mean .4940, std .2989 → b = 70
        #        50 + (50 + 70 - 69) // 2 = 50 + 25 = 75
        # Node2: CPU .857, Memory .125, GPU 0 -> .125
        #        without: mean .3274, std .3781 → b = 62;  with: mean .3690, std .3451 → b = 65
        #        50 + (50 + 65 - 62) // 2 = 50 + 26 = 76
        Case(
            [node("node1", 3500, 40000, gpus=8), node("node2", 3500, 40000, gpus=8)],
            pod(0, 0, gpus=1),
            [("node1", pod(3000, 5000, gpus=3)), ("node2", pod(3000, 5000))],
            weights=EXTENDED,
        ),
        [75, 76],
        id="scalar resource is included in the score computation if pod requests the scalar resource",
    ),
    pytest.param(
        # gpu not requested → two resources. CPU 0 -> 3000/3500 (.857), Memory 0 -> 5000/40000 (.125)
        # b: 100 -> int((1 - .366) * 100) = 63;  50 + (50 + 63 - 100) // 2 = 50 + 6 = 56 on both nodes
        Case([node("node1", 3500, 40000, gpus=8), node("node2", 3500, 40000)], pod(3000, 5000), weights=EXTENDED),
        [56, 56],
        id="scalar resource is not included in the score computation if pod doesn't request the scalar resource",
    ),
    # Not ported: "... if PreScore not called" (same function here) and the two DRA cases
    # ("include DRA resource on a node ...": DRA-backed extended resources do not exist in our model).
]


@pytest.mark.parametrize("case, expected", BALANCED)
def test_balanced_allocation(case: Case, expected: list[int]) -> None:
    assert run_case(BalancedAllocationScorer, case) == expected


# -- weight validation (Go: ValidateNodeResourcesFitArgs) ----------------------------------------------


@pytest.mark.parametrize(
    "weights",
    [
        pytest.param({"memory": -1, "cpu": 1}, id="resource with negative weight"),
        pytest.param({"memory": 1, "cpu": 101}, id="resource weight larger than MaxNodeScore"),
        pytest.param({"memory": 101}, id="resource weight larger than MaxNodeScore, one resource"),
        pytest.param({"cpu": 1, "ephemeral-storage": 1}, id="unknown resource"),
    ],
)
def test_invalid_weights_rejected(weights: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="weight|resource"):
        ResourceWeights(weights)


def test_zero_weight_leaves_resource_out() -> None:
    # Go rejects weight 0 ("resource with zero weight"); our ResourceWeights documents 0 as "leave the
    # resource out", so {"cpu": 0, "memory": 1} scores like a memory-only configuration.
    case = Case([node("node1", 4000, 10000), node("node2", 6000, 10000)], pod(3000, 5000))
    case.weights = {"cpu": 0, "memory": 1}
    with_zero = run_case(LeastAllocatedScorer, case)
    case.weights = {"memory": 1}
    assert with_zero == run_case(LeastAllocatedScorer, case) == [50, 50]  # (10000 - 5000) * 100 // 10000


def test_share_pod_gpu_request_is_its_milli() -> None:
    # Not a Go case: a share pod asks gpu_milli of one card. 8 cards = 8000 milli, 2 cards used.
    # LeastAllocated gpu: (8000 - 2000 - 250) * 100 // 8000 = 71; cpu (8000-4000)*100//8000 = 50;
    # memory (8000 - 4000) * 100 // 8000 = 50 → (50 + 50 + 71) // 3 = 57
    state = ClusterState([node("n", 8000, 8000, gpus=8)])
    existing = state.request(pod(2000, 2000, gpus=2))
    state.place(existing, 0, (0, 1))
    share = state.request(PodSpec("s", 2000, 2000, 1, 250))
    assert LeastAllocatedScorer().score(state, share, np.array([0])).values.tolist() == [57]
    # MostAllocated: gpu 2250 * 100 // 8000 = 28; cpu 50; memory 50 → (50 + 50 + 28) // 3 = 42
    assert MostAllocatedScorer().score(state, share, np.array([0])).values.tolist() == [42]
