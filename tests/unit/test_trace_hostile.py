"""Trace files built to hurt or simply broken: each stops with one TraceError naming the file and the
line, quickly and in little memory — never a traceback, a hang, or a silently different workload."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from rlsched.policy import TraceError, load_nodes, load_pods
from rlsched.policy.trace import MAX_CARDS_PER_NODE, MAX_NESTING, missing_input, output_problem, read_generic

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"


def error_of(reader, path: Path) -> str:
    with pytest.raises(TraceError) as info:
        reader(path)
    message = str(info.value)
    assert "\n" not in message and len(message) < 400, message
    return message


def test_cards_per_node_are_bounded_as_in_the_extender(tmp_path: Path) -> None:
    from rlsched.extender.objects import MAX_CARDS_PER_NODE as EXTENDER_BOUND

    assert MAX_CARDS_PER_NODE == EXTENDER_BOUND == 256
    ok = tmp_path / "ok.csv"
    ok.write_text(NODE_HEADER + "n0,64000,262144,256,A100\n")
    assert load_nodes(ok)[0].gpu_count == 256
    huge = tmp_path / "huge.csv"
    huge.write_text(NODE_HEADER + "n0,64000,262144,2,A100\nn1,64000,262144,99999999,P100\n")
    started = time.monotonic()
    message = error_of(load_nodes, huge)
    assert time.monotonic() - started < 5
    assert message.startswith(f"{huge}:3: column 'gpu': 99999999 GPU cards") and "at most 256" in message
    generic = tmp_path / "huge.yaml"
    generic.write_text("nodes:\n  - name: a\n    cpu: 1\n    memory: 1Gi\n    gpus: 257\n    gpuModel: A100\n")
    assert error_of(load_nodes, generic).startswith(f"{generic}:5: nodes[0].gpus: 257 GPU cards")


def test_a_repeated_key_is_an_error_at_its_second_line(tmp_path: Path) -> None:
    field = tmp_path / "field.yaml"
    field.write_text(
        "nodes:\n  - name: a\n    cpu: 96\n    memory: 384Gi\n    gpus: 8\n    gpus: 2\n    gpuModel: G2\n"
    )
    assert error_of(load_nodes, field) == f"{field}:6: key 'gpus': repeated key (first on line 5); give each key once"
    lists = tmp_path / "lists.yaml"
    lists.write_text(
        "nodes:\n  - {name: a, cpu: 1, memory: 1}\npods:\n  - {name: p}\nnodes:\n  - {name: b, cpu: 1, memory: 1}\n"
    )
    assert error_of(read_generic, lists).startswith(f"{lists}:5: key 'nodes': repeated key (first on line 1)")
    json_file = tmp_path / "twice.json"
    json_file.write_text('{"nodes": [{"name": "a", "cpu": 1, "memory": 1}],\n "nodes": []}')
    assert error_of(read_generic, json_file).startswith(f"{json_file}:2: key 'nodes': repeated key")


def test_aliases_are_refused_before_they_expand(tmp_path: Path) -> None:
    rows = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    rows += [f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi", strict=True)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(rows) + "\n")  # 9**9 ≈ 387 million strings once expanded
    started = time.monotonic()
    message = error_of(read_generic, bomb)
    assert time.monotonic() - started < 5
    assert message.startswith(f"{bomb}:2: alias *a: aliases are not supported")
    merge = tmp_path / "merge.yaml"
    merge.write_text("base: &b {cpu: 1, memory: 1}\nnodes:\n  - name: a\n    <<: *b\n")
    assert error_of(read_generic, merge).startswith(f"{merge}:4: alias *b")


def test_deep_nesting_is_refused_without_a_recursion_error(tmp_path: Path) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("nodes: " + "[" * 5000 + "]" * 5000 + "\n")
    assert f"nested more than {MAX_NESTING} levels deep" in error_of(read_generic, deep)
    deep_json = tmp_path / "deep.json"
    deep_json.write_text('{"nodes": ' + "[" * 3000 + "]" * 3000 + "}")
    assert "nested more than" in error_of(read_generic, deep_json)


def test_a_byte_order_mark_is_not_part_of_the_first_column(tmp_path: Path) -> None:
    plain = tmp_path / "plain.csv"
    plain.write_text(NODE_HEADER + "n0,64000,262144,2,P100\n")
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + (NODE_HEADER + "n0,64000,262144,2,P100\n").replace("\n", "\r\n").encode())
    assert load_nodes(bom) == load_nodes(plain)
    yaml_bom = tmp_path / "bom.yaml"
    yaml_bom.write_bytes(b"\xef\xbb\xbfnodes:\r\n  - {name: n0, cpu: 64, memory: 256Gi, gpus: 2, gpuModel: P100}\r\n")
    assert [n.name for n in load_nodes(yaml_bom)] == ["n0"]


def test_a_bad_byte_is_reported_on_its_own_line(tmp_path: Path) -> None:
    latin1 = tmp_path / "latin1.csv"
    latin1.write_bytes(NODE_HEADER.encode() + "né0,64000,262144,2,P100\n".encode("latin-1"))
    assert error_of(load_nodes, latin1).startswith(f"{latin1}:2: not UTF-8 text (byte b'\\xe9')")
    later = tmp_path / "later.csv"  # past the reader's first decoded block
    later.write_bytes(
        POD_HEADER.encode() + b"".join(f"p{i},1,1,0,0\n".encode() for i in range(3000)) + b"p\xff,1,1,0,0\n"
    )
    assert error_of(load_pods, later).startswith(f"{later}:3002: not UTF-8 text")
    mac = tmp_path / "mac.csv"  # Excel's "CSV (Macintosh)": lines end with a lone CR
    mac.write_bytes(NODE_HEADER.encode().replace(b"\n", b"\r") + b"n0,64000,262144,2,P100\rn\xe9,1,1,0,\r")
    assert error_of(load_nodes, mac).startswith(f"{mac}:3: not UTF-8 text")


def test_unknown_columns_are_named_in_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpuspec\np0,1,1,1,1000,V100M32\n")
    with caplog.at_level(logging.WARNING, logger="rlsched.policy.trace"):
        loaded = load_pods(pods)
    assert loaded[0].gpu_models == ()  # ignored, as documented ...
    assert [r.getMessage() for r in caplog.records] == [  # ... but said
        f"warning: {pods}:1: column(s) 'gpuspec' not known, ignored (known: name,cpu_milli,memory_mib,num_gpu,"
        "gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time)"
    ]
    caplog.clear()
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODE_HEADER + "n0,1,1,0,\n")
    with caplog.at_level(logging.WARNING, logger="rlsched.policy.trace"):
        load_nodes(nodes)
    assert not caplog.records


def test_a_folder_is_named_as_one_and_outputs_are_checked(tmp_path: Path) -> None:
    assert missing_input(tmp_path, "--init") == f"--init {tmp_path}: is a folder; give a file"
    afile = tmp_path / "nodes.csv"
    afile.write_text(NODE_HEADER)
    assert output_problem(tmp_path, "--json") == f"--json {tmp_path}: is a folder; give a file path"
    assert output_problem(afile, "--out", folder=True) == f"--out {afile}: is a file, not a folder"
    assert output_problem(afile / "x.json", "--json") == f"--json {afile / 'x.json'}: {afile} is a file, not a folder"
    assert output_problem(tmp_path / "new" / "deeper" / "x.json", "--json") is None
    assert output_problem(afile, "--json") is None  # an existing file is overwritten
