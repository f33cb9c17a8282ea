"""hack/demo.py's report: columns in line whatever the cells hold, cut messages marked with "…"."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def load_demo():
    spec = importlib.util.spec_from_file_location("rlsched_demo", REPO_ROOT / "hack" / "demo.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("rlsched_demo", module)
    spec.loader.exec_module(module)
    return module


def test_eight_cards_keep_the_columns_in_line() -> None:
    demo = load_demo()
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


def test_a_cut_message_ends_with_an_ellipsis_at_a_word() -> None:
    demo = load_demo()
    text = "0/8 nodes are available: 1 GPU model A100 not allowed (the pod accepts only GPU models no node has)"
    assert demo.cut(text, 400) == text
    short = demo.cut(text, 40)
    assert short.endswith("…") and len(short) <= 40 and text.startswith(short[:-1])
    assert short[:-1].split()[-1] in text.split(), "cut at a word boundary, not mid-word"
