"""Cluster variants (policy/variants.py): each changes the cluster in the one way it says."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from ppo_fixtures import small_nodes

from rlsched.policy.cluster import NodeSpec
from rlsched.policy.trace import load_nodes
from rlsched.policy.variants import VARIANTS, main, make_variant


def test_eight_cards_keeps_cpu_and_memory_per_card() -> None:
    nodes = small_nodes()
    out = make_variant("eight-cards", nodes)
    for a, b in zip(nodes, out, strict=True):
        assert a.name == b.name and a.gpu_model == b.gpu_model
        if a.gpu_count == 0:
            assert b == a
            continue
        assert b.gpu_count == 8
        assert b.cpu_milli / 8 == pytest.approx(a.cpu_milli / a.gpu_count, abs=1)
        assert b.memory_mib / 8 == pytest.approx(a.memory_mib / a.gpu_count, abs=1)


def test_half_is_a_seeded_half_in_order() -> None:
    nodes = small_nodes()
    a, b, c = make_variant("half", nodes, 1), make_variant("half", nodes, 1), make_variant("half", nodes, 2)
    assert a == b and a != c and len(a) == (len(nodes) + 1) // 2
    order = [n.name for n in nodes]
    assert [order.index(n.name) for n in a] == sorted(order.index(n.name) for n in a)


def test_model_mix_draws_from_the_models_of_the_same_card_count() -> None:
    nodes = small_nodes() + [NodeSpec(f"extra-{i}", 96_000, 393_216, 8, "G3") for i in range(5)]
    seen = {(n.gpu_count, n.gpu_model) for n in nodes}
    out = make_variant("model-mix", nodes, 3)
    assert [(n.name, n.gpu_count, n.cpu_milli) for n in out] == [(n.name, n.gpu_count, n.cpu_milli) for n in nodes]
    assert {(n.gpu_count, n.gpu_model) for n in out} <= seen
    assert [n.gpu_model for n in out] != [n.gpu_model for n in nodes]


def test_eight_cards_g2_makes_every_gpu_node_one_server_shape() -> None:
    nodes = small_nodes()
    out = make_variant("eight-cards-g2", nodes)
    for a, b in zip(nodes, out, strict=True):
        assert (b.name, b.gpu_model) == (a.name, a.gpu_model)
        if a.gpu_count == 0:
            assert b == a
        else:
            assert (b.gpu_count, b.cpu_milli, b.memory_mib) == (8, 96_000, 393_216)


def test_four_times_repeats_the_whole_list_with_unique_names() -> None:
    nodes = small_nodes()
    out = make_variant("four-times", nodes)
    assert len(out) == 4 * len(nodes) and len({n.name for n in out}) == len(out)
    for copy in range(4):
        block = out[copy * len(nodes) : (copy + 1) * len(nodes)]
        assert [replace(n, name=a.name) for n, a in zip(block, nodes, strict=True)] == nodes
        assert [n.name for n in block] == [f"{a.name}-r{copy}" for a in nodes]


def test_unknown_variant_names_the_choices() -> None:
    with pytest.raises(ValueError, match="eight-cards"):
        make_variant("nine-cards", small_nodes())


def test_main_writes_loadable_node_files(tmp_path: Path, capsys) -> None:
    from rlsched.policy.trace import dump_generic

    src = tmp_path / "nodes.json"
    src.write_text(dump_generic(small_nodes(), []))
    assert main([str(src), str(tmp_path / "out")]) == 0
    for name in VARIANTS:
        assert load_nodes(tmp_path / "out" / f"{name}.json") == make_variant(name, small_nodes())


@pytest.mark.parametrize(
    "args, message",
    [
        (["{broken}", "{out}"], "variants: {broken}:1: header lacks column(s)"),
        (["{dir}", "{out}"], "variants: nodes {dir}: is a folder; give a file"),
        (["{missing}", "{out}"], "variants: no such file: {missing}"),
        (["{nodes}", "{out}", "--seed", "-1"], "variants: --seed must be a whole number from 0"),
        (["{nodes}", "{nodes}"], "variants: out_dir {nodes}: is a file, not a folder"),
    ],
)
def test_main_refuses_bad_input_in_one_line(tmp_path: Path, capsys, args: list[str], message: str) -> None:
    from rlsched.policy.trace import dump_generic

    paths = {
        "broken": tmp_path / "broken.csv",
        "dir": tmp_path / "adir",
        "missing": tmp_path / "missing.csv",
        "nodes": tmp_path / "nodes.json",
        "out": tmp_path / "out",
    }
    paths["broken"].write_text("sn,cpu_milli\n")
    paths["dir"].mkdir()
    paths["nodes"].write_text(dump_generic(small_nodes(), []))
    fill = {k: str(v) for k, v in paths.items()}
    assert main([a.format(**fill) for a in args]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(message.format(**fill)) and err.count("\n") == 1 and out == ""
    assert not paths["out"].exists()
