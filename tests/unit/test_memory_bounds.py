"""Memory is bounded in bytes, not in MiB: the Kubernetes scorers count it in bytes in int64 (Go's
arithmetic, bytes × 100), so a node or pod whose bytes pass 2**53 is refused where it is read — a trace's
CSV cell or YAML quantity, a spec built in code — with one line naming the place, never an
OverflowError from the scorers or a wrapped-around score."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_trace_hostile import error_of

from rlsched.cli import main as rlsched_main
from rlsched.policy import ClusterState, NodeSpec, PodSpec, load_nodes, load_pods, make_scorer
from rlsched.policy.cluster import MIB
from rlsched.policy.resources import MEMORY_MIB_LIMIT, QUANTITY_LIMIT
from rlsched.policy.trace import NODE_MEMORY_MIB_MOST, POD_MEMORY_MIB_MOST, dump_generic

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"


def test_the_bounds_are_the_extenders() -> None:
    """A node's bytes below 2**53 (the extender refuses more); a pod's at most 2**53 (the extender's
    saturated request, which the decision log records and a fine-tuning trace writes back)."""
    from rlsched.extender.objects import MAX_QUANTITY

    assert MEMORY_MIB_LIMIT == 2**33 and MEMORY_MIB_LIMIT * MIB == QUANTITY_LIMIT == MAX_QUANTITY
    assert NODE_MEMORY_MIB_MOST == (MAX_QUANTITY - 1) >> 20 and POD_MEMORY_MIB_MOST == MAX_QUANTITY >> 20


@pytest.mark.parametrize("mib", [2**33, 2**43, 2**53 - 1])
def test_a_csv_node_beyond_the_bound_is_refused_on_its_line(tmp_path: Path, mib: int) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text(NODE_HEADER + f"n0,64000,{2**33 - 1},8,G2\nn1,96000,{mib},8,G2\n")
    message = error_of(load_nodes, path)
    assert message.startswith(f"{path}:3: column 'memory_mib': {mib} MiB is unreasonably large"), message
    assert f"at most {2**33 - 1} MiB" in message


@pytest.mark.parametrize("mib", [2**33 + 1, 9_000_000_000_000, 2**53 - 1])
def test_a_csv_pod_beyond_the_bound_is_refused_on_its_line(tmp_path: Path, mib: int) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(POD_HEADER + f"p0,1000,{2**33},1,500\np1,1000,{mib},1,500\n")
    message = error_of(load_pods, path)
    assert message.startswith(f"{path}:3: column 'memory_mib': {mib} MiB is unreasonably large"), message


@pytest.mark.parametrize("memory", ["8Ei", "8Pi", "8589934592Mi", "'9007199254740991'", "9007199254740991", "16384Ei"])
def test_a_yaml_node_beyond_the_bound_is_refused_at_its_field(tmp_path: Path, memory: str) -> None:
    path = tmp_path / "nodes.yaml"
    path.write_text(f"nodes:\n  - name: g\n    cpu: 96\n    memory: {memory}\n    gpus: 8\n    gpuModel: T4\n")
    message = error_of(load_nodes, path)
    quoted = memory if memory.isdigit() or memory.startswith("'") else f"'{memory}'"  # a YAML number: bare
    assert message.startswith(f"{path}:4: nodes[0].memory: {quoted} is unreasonably large"), message
    assert f"at most {2**33 - 1} MiB" in message


@pytest.mark.parametrize("memory", ["8Ei", "8589934593Mi", "8796093022208"])
def test_a_yaml_pod_beyond_the_bound_is_refused_at_its_field(tmp_path: Path, memory: str) -> None:
    path = tmp_path / "pods.yaml"
    path.write_text(f"pods:\n  - name: a\n    cpu: 1\n    memory: {memory}\n    gpus: 1\n")
    message = error_of(load_pods, path)
    quoted = memory if memory.isdigit() else f"'{memory}'"
    assert message.startswith(f"{path}:4: pods[0].memory: {quoted} is unreasonably large"), message


def test_the_largest_node_and_pod_are_read(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODE_HEADER + f"n0,64000,{2**33 - 1},8,G2\n")
    assert load_nodes(nodes)[0].memory_mib == 2**33 - 1
    yaml_nodes = tmp_path / "nodes.yaml"
    yaml_nodes.write_text("nodes:\n  - name: g\n    cpu: 96\n    memory: 8191Ti\n")
    assert load_nodes(yaml_nodes)[0].memory_mib == 8191 << 20
    # A saturated request (the extender's, as the decision log records it) survives the trace round trip.
    pods = tmp_path / "pods.json"
    pods.write_text(dump_generic([], [PodSpec("big", 1000, 2**33, 1, 500), PodSpec("small", 1000, 1024)]))
    assert [p.memory_mib for p in load_pods(pods)] == [2**33, 1024]


def test_specs_built_in_code_are_bounded_too() -> None:
    """The decision log and the variants build specs without the trace reader: the specs refuse."""
    with pytest.raises(ValueError, match="memory 10000000000000 MiB is unreasonably large"):
        NodeSpec("a", 64000, 10**13, 2, "T4")
    with pytest.raises(ValueError, match="unreasonably large"):
        NodeSpec("a", 64000, 2**33, 2, "T4")
    with pytest.raises(ValueError, match="unreasonably large"):
        PodSpec("p", 1000, 2**33 + 1)
    assert PodSpec("p", 1000, 2**33).memory_mib == 2**33


@pytest.mark.parametrize("scorer", ["least-allocated", "most-allocated"])
def test_the_largest_nodes_score_with_gos_arithmetic(scorer: str) -> None:
    """Half of the largest node's memory in use: Go's int64 arithmetic, done here in Python's exact ints
    (bytes × 100 stays far below 2**63 at the bound)."""
    most = NODE_MEMORY_MIB_MOST
    state = ClusterState([NodeSpec("a", 64000, most, 2, "T4"), NodeSpec("b", 64000, most, 2, "T4")])
    state.place(state.request(PodSpec("x", 1000, most // 2)), 0, ())
    req = state.request(PodSpec("p", 1000, 1000, 1, 500))
    values = make_scorer(scorer).score(state, req, np.array([0, 1])).values
    alloc = most * MIB
    used = [(1000 + 1000, 64000), ((most // 2) * MIB + 1000 * MIB, alloc), (500, 2000)]  # node a
    fresh = [(1000, 64000), (1000 * MIB, alloc), (500, 2000)]  # node b
    if scorer == "least-allocated":
        expected = [sum((a - r) * 100 // a for r, a in node) // 3 for node in (used, fresh)]
    else:
        expected = [sum(r * 100 // a for r, a in node) // 3 for node in (used, fresh)]
    assert values.tolist() == expected


def test_evaluate_refuses_huge_memory_in_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Once an OverflowError traceback from the scorers' bytes (the command catches ValueError only)."""
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODE_HEADER + f"n1,96000,{2**53 - 1},8,G2\nn2,96000,393216,8,G2\n")
    pods.write_text(POD_HEADER + "p1,1000,9000000000000,1,500\np2,1000,1000,1,1000\n")
    argv = ["evaluate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd", "--seeds", "42"]
    code = rlsched_main([*argv, "--jobs", "1", "--no-progress", "--out", str(tmp_path / "o")])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"rlsched evaluate: {nodes}:2: column 'memory_mib': ")
