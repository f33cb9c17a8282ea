"""Trace readers: openb CSV (nodes, pods in full and short layout) and the generic YAML/JSON format.

Every malformed input must stop loading with a :class:`TraceError` whose message names the file, the
line (where there is one), the column or field, and what was expected.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlsched.policy import NodeSpec, PodSpec, TraceError, load_nodes, load_pods
from rlsched.policy.trace import (
    OPENB_ENV,
    OPENB_NODES,
    OPENB_PODS,
    dump_generic,
    missing_input,
    openb_default,
    openb_file,
    read_generic,
    read_openb_nodes,
    read_openb_pods,
)

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def trace_error(reader, path: Path, line: int | None, where: str | None, *expected: str) -> TraceError:
    """Read ``path``, expect a TraceError at ``line`` / ``where`` whose message contains ``expected``."""
    with pytest.raises(TraceError) as info:
        reader(path)
    err = info.value
    message = str(err)
    assert err.path == str(path) and message.startswith(str(path)), message
    assert err.line == line, message
    if line is not None:
        assert message.startswith(f"{path}:{line}:"), message
    assert err.where == where, message
    if where is not None:
        assert f": {where}: " in message, message
    for text in expected:
        assert text in message, message
    return err


# -- openb CSV: good files -------------------------------------------------------------------------


def test_openb_nodes(tmp_path: Path) -> None:
    path = write(
        tmp_path, "nodes.csv", f"{NODE_HEADER}\nopenb-node-0001,96000,786432,8,G2\nopenb-node-0002, 64000 ,262144,0,\n"
    )
    assert read_openb_nodes(path) == [
        NodeSpec("openb-node-0001", 96000, 786432, 8, "G2"),
        NodeSpec("openb-node-0002", 64000, 262144, 0, ""),
    ]
    assert load_nodes(path) == read_openb_nodes(path)


def test_openb_pods_full_layout(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "pods.csv",
        POD_HEADER + "\n"
        "p1,8000,30720,1,460,,LS,Running,10,20,11\n"
        "p2,4000,0,2,1000,V100M16|V100M32,BE,Running,0,,\n"
        "p3,1000,1024,0,0,,LS,Running,,,\n",
    )
    assert read_openb_pods(path) == [
        PodSpec("p1", 8000, 30720, 1, 460, (), 10, 20, "LS"),
        PodSpec("p2", 4000, 0, 2, 1000, ("V100M16", "V100M32"), 0, None, "BE"),
        PodSpec("p3", 1000, 1024, 0, 0, (), None, None, "LS"),
    ]


@pytest.mark.parametrize("qos", ["L S", "LS;rm", "ＬＳ", "x" * 40, "-LS"])
def test_openb_pods_refuse_a_malformed_qos(tmp_path: Path, qos: str) -> None:
    path = write(tmp_path, "pods.csv", POD_HEADER + f"\np1,8000,30720,1,460,,{qos},Running,10,20,11\n")
    with pytest.raises(TraceError, match="qos"):
        read_openb_pods(path)


def test_openb_pods_short_layout(tmp_path: Path) -> None:
    path = write(tmp_path, "multi.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,8000,30720,4,1000\n")
    assert load_pods(path) == [PodSpec("p1", 8000, 30720, 4, 1000)]


# -- openb CSV: malformed --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, line, where, expected",
    [
        ("n1,1000,1000,0\n", 2, None, ["has 4 fields, the header has 5"]),
        ("n1,1000,1000,0,,extra\n", 2, None, ["has 6 fields, the header has 5"]),
        (
            "n1,1000,1000,0,\nn2,abc,1000,0,\n",
            3,
            "column 'cpu_milli'",
            ["expected a non-negative integer (millicores), got 'abc'"],
        ),
        ("n1,1000,1.5,0,\n", 2, "column 'memory_mib'", ["expected a non-negative integer (MiB), got '1.5'"]),
        ("n1,1000,1000,-2,\n", 2, "column 'gpu'", ["expected a non-negative integer (number of GPU cards), got -2"]),
        ("n1,1000,,0,\n", 2, "column 'memory_mib'", ["got ''"]),
        (",1000,1000,0,\n", 2, "column 'sn'", ["expected a node name, got an empty field"]),
        ("n1,1000,1000,0,\nn2,1,1,0,\nn1,1000,1000,0,\n", 4, "column 'sn'", ["node 'n1' already defined on line 2"]),
        ("n1,1000,1000,8,\n", 2, "column 'model'", ["node has 8 GPUs, so a GPU model name is expected"]),
        ("n1,1000,1000,0,T4\n", 2, "column 'gpu'", ["model is 'T4' but gpu is 0"]),
        ("n1,1000,1000,0,\n\nn2,1000,1000,0,\n", 3, None, ["empty row"]),
    ],
)
def test_openb_nodes_malformed(tmp_path: Path, body, line, where, expected) -> None:
    path = write(tmp_path, "nodes.csv", f"{NODE_HEADER}\n{body}")
    trace_error(read_openb_nodes, path, line, where, *expected)


def test_openb_nodes_bad_header_and_empty(tmp_path: Path) -> None:
    missing = write(tmp_path, "a.csv", "sn,cpu_milli,memory_mib,model\nn1,1,1,\n")
    trace_error(
        read_openb_nodes,
        missing,
        1,
        None,
        "header lacks column(s) gpu",
        "expected sn,cpu_milli,memory_mib,gpu,model",
        "got sn,cpu_milli,memory_mib,model",
    )
    twice = write(tmp_path, "b.csv", "sn,cpu_milli,memory_mib,gpu,model,gpu\n")
    trace_error(read_openb_nodes, twice, 1, None, "column(s) gpu appear twice")
    empty = write(tmp_path, "c.csv", "")
    trace_error(read_openb_nodes, empty, 1, None, "empty file", "expected a header line")
    header_only = write(tmp_path, "d.csv", NODE_HEADER + "\n")
    trace_error(read_openb_nodes, header_only, None, None, "no nodes")
    trace_error(read_openb_nodes, tmp_path / "absent.csv", None, None, "cannot open")


@pytest.mark.parametrize(
    "row, where, expected",
    [
        (
            "p1,1000,1000,2,500,,LS,Running,0,1,0",
            "columns 'num_gpu', 'gpu_milli'",
            ["a pod asking for 2 GPUs must take whole cards (gpu_milli = 1000, got 500)"],
        ),
        (
            "p1,1000,1000,0,500,,LS,Running,0,1,0",
            "columns 'num_gpu', 'gpu_milli'",
            ["gpu_milli is 500 but num_gpu is 0"],
        ),
        ("p1,1000,1000,1,0,,LS,Running,0,1,0", "columns 'num_gpu', 'gpu_milli'", ["gpu_milli must be in 1..1000"]),
        ("p1,1000,1000,1,1500,,LS,Running,0,1,0", "columns 'num_gpu', 'gpu_milli'", ["got 1500"]),
        (
            "p1,1000,1000,x,1000,,LS,Running,0,1,0",
            "column 'num_gpu'",
            ["expected a non-negative integer (whole GPUs, or 1 for a share of a card), got 'x'"],
        ),
        ("p1,-5,1000,0,0,,LS,Running,0,1,0", "column 'cpu_milli'", ["got -5"]),
        (
            "p1,1000,1000,1,500,,LS,Running,100,50,0",
            "column 'deletion_time'",
            ["deletion_time 50 is before creation_time 100"],
        ),
        (
            "p1,1000,1000,1,500,,LS,Running,1.5,50,0",
            "column 'creation_time'",
            ["expected a non-negative integer (seconds), got '1.5'"],
        ),
        (
            "p1,1000,1000,1,500,V100||T4,LS,Running,0,1,0",
            "column 'gpu_spec'",
            ["expected GPU models joined by '|'", "got 'V100||T4'"],
        ),
        ("p1,1000,1000,1,500,|,LS,Running,0,1,0", "column 'gpu_spec'", ["got '|'"]),
        (",1000,1000,0,0,,LS,Running,0,1,0", "column 'name'", ["expected a pod name, got an empty field"]),
        ("p1,1000,1000,0,0,,LS,Running,0,1", None, ["has 10 fields, the header has 11"]),
    ],
)
def test_openb_pods_malformed(tmp_path: Path, row, where, expected) -> None:
    path = write(tmp_path, "pods.csv", f"{POD_HEADER}\np0,1,1,0,0,,LS,Running,0,1,0\n{row}\n")
    trace_error(read_openb_pods, path, 3, where, *expected)


def test_openb_pods_duplicates_and_header(tmp_path: Path) -> None:
    dupes = write(tmp_path, "dupes.csv", f"{POD_HEADER}\np0,1,1,0,0,,,,,,\np1,1,1,0,0,,,,,,\np0,2,2,0,0,,,,,,\n")
    trace_error(read_openb_pods, dupes, 4, "column 'name'", "pod 'p0' already defined on line 2")
    short = write(tmp_path, "short.csv", "name,cpu_milli,memory_mib,num_gpu\np0,1,1,0\n")
    trace_error(
        read_openb_pods,
        short,
        1,
        None,
        "header lacks column(s) gpu_milli",
        "expected name,cpu_milli,memory_mib,num_gpu,gpu_milli",
        "optional: gpu_spec,",
    )
    header_only = write(tmp_path, "header.csv", POD_HEADER + "\n")
    trace_error(load_pods, header_only, None, None, "no pods")


def test_openb_reader_never_drops_rows(tmp_path: Path) -> None:
    rows = [f"p{i},{i},{i},0,0,,,,,," for i in range(50)]
    path = write(tmp_path, "pods.csv", POD_HEADER + "\n" + "\n".join(rows) + "\n")
    assert [p.name for p in read_openb_pods(path)] == [f"p{i}" for i in range(50)]


# -- generic YAML / JSON: good files ---------------------------------------------------------------

GENERIC = """\
apiVersion: v1
kind: Trace
nodes:
  - name: gpu-a
    cpu: "96"
    memory: 384Gi
    gpus: 8
    gpuModel: V100M32
    labels: {zone: a, rack: 7}
    count: 3
  - name: cpu-b
    cpu: 500m
    memory: 1024
pods:
  - name: train
    cpu: 8
    memory: 32Gi
    gpus: 2
    count: 2
  - name: share
    cpu: 1500m
    memory: 512Mi
    gpus: 1
    gpuMilli: 500
    gpuModels: V100M16|V100M32
    creationTime: 0
    deletionTime: 3600.5
  - name: cpu-only
"""


def test_generic_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, "trace.yaml", GENERIC)
    trace = read_generic(path)
    assert [n.name for n in trace.nodes] == ["gpu-a-0", "gpu-a-1", "gpu-a-2", "cpu-b"]  # count expansion
    assert trace.nodes[0] == NodeSpec("gpu-a-0", 96000, 384 * 1024, 8, "V100M32", {"zone": "a", "rack": "7"})
    assert trace.nodes[3] == NodeSpec("cpu-b", 500, 1024)  # bare int = MiB
    assert trace.pods == (
        PodSpec("train-0", 8000, 32768, 2, 1000),  # gpuMilli defaults to 1000
        PodSpec("train-1", 8000, 32768, 2, 1000),
        PodSpec("share", 1500, 512, 1, 500, ("V100M16", "V100M32"), 0, 3600.5),
        PodSpec("cpu-only", 0, 0),
    )
    assert load_nodes(path) == list(trace.nodes) and load_pods(path) == list(trace.pods)


def test_generic_json_roundtrip(tmp_path: Path) -> None:
    nodes = [NodeSpec("a", 1500, 2048, 2, "T4", {"zone": "x"}), NodeSpec("b", 1000, 1024)]
    pods = [PodSpec("p", 250, 100, 1, 300, ("T4",), 1.0, 2.0), PodSpec("q", 1000, 0, 2, 1000), PodSpec("r", 0, 1)]
    path = write(tmp_path, "trace.json", dump_generic(nodes, pods))
    json.loads(path.read_text())  # it is JSON
    assert load_nodes(path) == nodes and load_pods(path) == pods


def test_generic_empty_sections(tmp_path: Path) -> None:
    only_nodes = write(tmp_path, "nodes.yaml", "nodes:\n  - {name: a, cpu: 1, memory: 1Gi}\n")
    trace_error(load_pods, only_nodes, None, "pods", "no pods defined; add a 'pods:' list")
    only_pods = write(tmp_path, "pods.yml", "pods:\n  - {name: a}\n")
    trace_error(load_nodes, only_pods, None, "nodes", "no nodes defined; add a 'nodes:' list")
    empty = write(tmp_path, "empty.yaml", "")
    assert read_generic(empty).nodes == () and read_generic(empty).pods == ()


# -- generic YAML / JSON: malformed ----------------------------------------------------------------


@pytest.mark.parametrize(
    "text, line, where, expected",
    [
        # unknown field, with the line of the offending key
        ("pods:\n  - name: p\n    cpu: 1\n    gpu: 1\n", 4, "pods[0].gpu", ["unknown field; known fields:", "gpus"]),
        (
            "nodes:\n  - name: n\n    cpu: 12x\n    memory: 1Gi\n",
            3,
            "nodes[0].cpu",
            ["'12x' is not a Kubernetes quantity", "cores, e.g. '64' or '500m'"],
        ),
        (
            "nodes:\n  - name: n\n    cpu: 1\n    memory: 12x\n",
            4,
            "nodes[0].memory",
            ["'12x' is not a Kubernetes quantity"],
        ),
        ("nodes:\n  - name: n\n    memory: 1Gi\n", 2, "nodes[0].cpu", ["required field missing"]),
        ("nodes:\n  - name: n\n    cpu: '-1'\n    memory: 1Gi\n", 3, "nodes[0].cpu", ["must not be negative"]),
        (
            "nodes:\n  - name: n\n    cpu: 1\n    memory: 1Gi\n    gpus: 2\n",
            2,
            "nodes[0].gpuModel",
            ["node has 2 GPUs, so a GPU model name is expected"],
        ),
        (
            "nodes:\n  - name: n\n    cpu: 1\n    memory: 1Gi\n    gpus: 1.5\n    gpuModel: T4\n",
            5,
            "nodes[0].gpus",
            ["must be a whole number"],
        ),
        (
            "nodes:\n  - name: n\n    cpu: 1\n    memory: 1Gi\n    labels: [a]\n",
            5,
            "nodes[0].labels",
            ["expected a mapping"],
        ),
        ("nodes:\n  - cpu: 1\n    memory: 1Gi\n", 2, "nodes[0].name", ["expected a non-empty string"]),
        ("nodes:\n  - name: ''\n    cpu: 1\n    memory: 1Gi\n", 2, "nodes[0].name", ["expected a non-empty string"]),
        ("pods:\n  - name: p\n    count: 0\n", 3, "pods[0].count", ["expected a positive integer, got 0"]),
        ("pods:\n  - name: p\n    count: '3'\n", 3, "pods[0].count", ["expected a positive integer, got '3'"]),
        ("pods:\n  - name: p\n    gpus: 2\n    gpuMilli: 500\n", 4, "pods[0].gpuMilli", ["must take whole cards"]),
        ("pods:\n  - name: p\n    gpuMilli: 500\n", 3, "pods[0].gpuMilli", ["gpu_milli is 500 but num_gpu is 0"]),
        (
            "pods:\n  - name: p\n    gpus: 1\n    gpuMilli: 0.5\n",
            4,
            "pods[0].gpuMilli",
            ["expected an integer 1..1000, got 0.5"],
        ),
        (
            "pods:\n  - name: p\n    gpus: 1\n    gpuModels: [T4, '']\n",
            4,
            "pods[0].gpuModels",
            ["expected a list of GPU model names"],
        ),
        (
            "pods:\n  - name: p\n    creationTime: -1\n",
            3,
            "pods[0].creationTime",
            ["expected non-negative seconds, got -1"],
        ),
        (
            "pods:\n  - name: p\n    creationTime: 10\n    deletionTime: 5\n",
            4,
            "pods[0].deletionTime",
            ["is before creationTime"],
        ),
        ("pods:\n  - name: ok\n  - just-a-string\n", 1, "pods[1]", ["expected a mapping of fields"]),
        ("pods: {name: p}\n", 1, "pods", ["expected a list of pods"]),
        ("pods:\n  - name: p\nextra: 1\n", 3, "extra", ["unknown top-level key; expected 'nodes' and/or 'pods'"]),
        ("- a\n- b\n", 1, None, ["expected a mapping with 'nodes:' and/or 'pods:' lists"]),
        ("pods:\n  - name: p\n    cpu: [1\n", 4, None, ["not valid YAML/JSON"]),
    ],
)
def test_generic_malformed(tmp_path: Path, text, line, where, expected) -> None:
    path = write(tmp_path, "trace.yaml", text)
    trace_error(read_generic, path, line, where, *expected)


def test_generic_duplicate_names_name_the_line(tmp_path: Path) -> None:
    # The second definition's line is named, and the count expansion is taken into account:
    # "p" with count 2 makes p-0 and p-1, which collides with the explicit p-1 on line 5.
    path = write(tmp_path, "trace.yaml", "pods:\n  - name: p\n    count: 2\n  - name: q\n  - name: p-1\n")
    trace_error(read_generic, path, 5, "pods[2].name", "name 'p-1' is used twice", "pods[0]")
    nodes = write(
        tmp_path, "nodes.yaml", "nodes:\n  - {name: a, cpu: 1, memory: 1}\n  - {name: a, cpu: 1, memory: 1}\n"
    )
    trace_error(read_generic, nodes, 3, "nodes[1].name", "name 'a' is used twice")


def test_generic_missing_file_and_bad_encoding(tmp_path: Path) -> None:
    trace_error(read_generic, tmp_path / "absent.yaml", None, None, "cannot open")
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00nodes")
    trace_error(read_generic, binary, 1, None, "not UTF-8 text")


# -- where the openb files are ---------------------------------------------------------------------


def test_openb_defaults_come_from_the_variable(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv(OPENB_ENV, str(tmp_path))
    assert openb_file(OPENB_NODES) == str(tmp_path / OPENB_NODES)
    assert openb_default(None, "--pods", OPENB_PODS) == str(tmp_path / OPENB_PODS)
    assert openb_default(None, "--data") == str(tmp_path)
    assert openb_default("mine.csv", "--pods", OPENB_PODS) == "mine.csv"  # the flag wins


def test_without_the_variable_the_error_names_the_flag_and_the_variable(monkeypatch) -> None:
    monkeypatch.delenv(OPENB_ENV, raising=False)
    assert openb_file(OPENB_NODES) == OPENB_NODES  # a bare name: found only in the current folder
    with pytest.raises(ValueError, match=f"give --nodes, or set {OPENB_ENV}"):
        openb_default(None, "--nodes", OPENB_NODES)
    assert openb_default("mine.csv", "--nodes", OPENB_NODES) == "mine.csv"
    assert OPENB_ENV in missing_input(OPENB_NODES, "--nodes") and "--nodes" in missing_input(OPENB_NODES, "--nodes")
    assert missing_input("elsewhere.csv", "--nodes") == "no such file: elsewhere.csv"


def test_rlsched_train_without_nodes_or_the_variable_says_what_to_give(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != OPENB_ENV}
    done = subprocess.run(
        [sys.executable, "-m", "rlsched", "train", "--method", "es"],
        cwd=tmp_path,
        env={**env, "PYTHONSAFEPATH": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert f"no such file: {OPENB_NODES}" in done.stderr and "--nodes" in done.stderr and OPENB_ENV in done.stderr


@pytest.mark.parametrize(
    "memory, mib",
    [
        ("16384", 16384),  # an unquoted integer
        ('"16384"', 16384),  # quoted, like cpu: "96"
        ("2048.0", 2048),  # a float
        ("4e5", 400000),  # a string with an exponent (YAML 1.1 reads it as text)
        ('"4e5"', 400000),
        ("512Mi", 512),
        ('"1Gi"', 1024),
        ("1048576k", 1000),  # a unit: 1,048,576,000 bytes → MiB, rounded up
    ],
)
def test_generic_memory_without_a_unit_is_always_mib(tmp_path: Path, memory: str, mib: int) -> None:
    path = write(tmp_path, "t.yaml", f"pods:\n  - name: p\n    cpu: 1\n    memory: {memory}\n")
    assert load_pods(path)[0].memory_mib == mib


def test_generic_json_memory_numbers_are_mib(tmp_path: Path) -> None:
    doc = (
        '{"nodes": [{"name": "a", "cpu": 8, "memory": "393216"}], '
        '"pods": [{"name": "p", "memory": 2048.0}, {"name": "q", "memory": 4e5}]}'
    )
    path = write(tmp_path, "t.json", doc)
    assert load_nodes(path)[0].memory_mib == 393216
    assert [p.memory_mib for p in load_pods(path)] == [2048, 400000]


@pytest.mark.parametrize("memory", ["1.5", '"1.5"', "2048.25"])
def test_generic_memory_without_a_unit_must_be_whole_mib(tmp_path: Path, memory: str) -> None:
    path = write(tmp_path, "t.yaml", f"pods:\n  - name: p\n    cpu: 1\n    memory: {memory}\n")
    with pytest.raises(TraceError, match="has no unit, so it means MiB, and must be a whole number of MiB"):
        load_pods(path)


def test_generic_gpu_models_joined_by_bar_are_stripped(tmp_path: Path) -> None:
    path = write(tmp_path, "t.yaml", 'pods:\n  - {name: p, cpu: 1, gpus: 1, gpuModels: "T4 | G2"}\n')
    assert load_pods(path)[0].gpu_models == ("T4", "G2")
