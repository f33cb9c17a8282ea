"""hack/demo.py's report: columns in line whatever the cells hold, cut messages marked with "…", and
whether the pods were placed with node load said from the extender's decision records."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from benchmark_scripts import load_hack_script

COLUMNS = ("cpu", "memory", "network", "disk")


@pytest.fixture(scope="module")
def demo() -> Any:
    return load_hack_script("demo")


def test_eight_cards_keep_the_columns_in_line(demo: Any) -> None:
    rows = [
        ("POD", "NODE", "CARDS", "MILLI/CARD", "WANTED"),
        ("big", "g8-0", "0,1,2,3,4,5,6,7", "1000", "8 card(s), 16 cpu"),
        ("share", "t4-0", "1", "500", "500 milli, 2 cpu"),
    ]
    lines = demo.table(rows, right=frozenset({3})).splitlines()
    starts = {line.index(cell) for line, cell in zip(lines, ("WANTED", "8 card(s)", "500 milli"), strict=True)}
    assert len(starts) == 1, lines
    assert lines[1].index("1000") + 4 == lines[2].index("500 milli") - 2  # right-aligned numbers end together
    assert {line.index(n) for line, n in zip(lines, ("MILLI/CARD", "      1000", "       500"), strict=True)} == {
        lines[0].index("MILLI/CARD")
    }


def test_a_cut_message_ends_with_an_ellipsis_at_a_word(demo: Any) -> None:
    text = "0/8 nodes are available: 1 GPU model A100 not allowed (the pod accepts only GPU models no node has)"
    assert demo.cut(text, 400) == text
    short = demo.cut(text, 40)
    assert short.endswith("…") and len(short) <= 40 and text.startswith(short[:-1])
    assert short[:-1].split()[-1] in text.split(), "cut at a word boundary, not mid-word"


# --- whether the pods were placed with node load -------------------------------------------------------


def columns(fresh: int) -> dict[str, dict]:
    return {k: {"configured": True, "freshNodes": fresh, "lastError": None} for k in COLUMNS}


def record(uid: str, node: str, load: float | None) -> dict:
    return {
        "kind": "filter",
        "pod": {"uid": uid},
        "node": node,
        "time": 0.0,
        "features": {"node": {"load": dict.fromkeys(COLUMNS, load)}},
    }


PODS = {
    "train-8gpu": {"metadata": {"uid": "u1"}, "spec": {"nodeName": "demo-v100-1"}},
    "infer-1gpu-a": {"metadata": {"uid": "u2"}, "spec": {"nodeName": "demo-a100-0"}},
}


def report(demo: Any, loads: tuple[float | None, float | None], wait: Any, capsys: Any) -> str:
    """:func:`report_load` on two placed pods whose decision records saw ``loads`` on their nodes."""
    recs = [record("u1", "demo-v100-1", loads[0]), record("u2", "demo-a100-0", loads[1])]
    extender = SimpleNamespace(
        decisions=lambda after=0, limit=4096: {"records": recs if after == 0 else [], "next": len(recs)}
    )
    cluster = SimpleNamespace(kubectl=lambda *a, **k: SimpleNamespace(returncode=1, stdout=""))
    demo.report_load(cluster, SimpleNamespace(extender=extender), {"load": {"columns": columns(8)}}, PODS, wait)
    return capsys.readouterr().out


def test_load_that_arrives_after_the_wait_is_reported_as_seen(demo: Any, capsys: Any) -> None:
    """The wait gave up with no fresh load, but the extender kept polling and had load before it placed
    the pods: the report must not say they were placed without it."""
    wait = demo.LoadWait(columns(0), 10.0, False, "not known yet: no fresh value from Prometheus after 10 s")
    out = report(demo, (0.1, 0.08), wait, capsys)
    assert "not known yet" in out  # what was known at submission is still said
    assert "WITHOUT" not in out, out
    assert "All 2 placements saw the chosen node's load" in out and "placed WITH it" in out
    assert "cpu 2/2, memory 2/2, network 2/2, disk 2/2" in out


def test_placements_without_load_are_said_to_be_without_it(demo: Any, capsys: Any) -> None:
    wait = demo.LoadWait(columns(0), 10.0, False, "not known yet: no fresh value from Prometheus after 10 s")
    out = report(demo, (None, None), wait, capsys)
    assert "None of the 2 placements saw the chosen node's load" in out and "WITHOUT node load" in out


def test_some_placements_with_load_are_counted(demo: Any, capsys: Any) -> None:
    wait = demo.LoadWait(columns(3), 10.0, False, "known only in part after 10 s (cpu 3/8 demo nodes fresh)")
    out = report(demo, (None, 0.08), wait, capsys)
    assert "1 of 2 placements saw the chosen node's load; 1 was placed WITHOUT it" in out
    assert "cpu 1/2" in out


def test_known_load_seen_by_every_placement_needs_no_verdict(demo: Any, capsys: Any) -> None:
    out = report(demo, (0.1, 0.08), demo.LoadWait(columns(8), 40.0, True), capsys)
    assert "waited 40 s" in out and "cpu 2/2" in out
    assert "WITHOUT" not in out and "placements saw the chosen node's load:" not in out


def test_no_prometheus_and_no_records_are_said_plainly(demo: Any, capsys: Any) -> None:
    wait = demo.LoadWait(None, 0.0, False, "none: the extender reads no Prometheus (no prometheus.url)")
    out = report(demo, (None, None), wait, capsys)
    assert "reads no Prometheus" in out and "WITHOUT node load" in out
    assert demo.placement_verdict({}, False).startswith("Whether the placements saw node load is unknown")
