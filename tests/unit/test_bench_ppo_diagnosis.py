"""benchmarks/ppo_diagnosis.py: a run that played no seed in time stops with a message, not a traceback."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from benchmark_scripts import load_benchmark

from rlsched.policy.learned import DEFAULT_MODEL


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The script loaded for this test only: ``sys.modules`` gets back what it held, so another test's
    copy (whose worker function the process pool pickles by name) is not shadowed by this one."""
    monkeypatch.setitem(sys.modules, "ppo_diagnosis", None)
    monkeypatch.delitem(sys.modules, "ppo_diagnosis")
    return load_benchmark("ppo_diagnosis")


def test_no_seed_played_before_the_deadline_stops_with_a_message(
    bench: Any, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    monkeypatch.setattr(bench, "collect", lambda args: ({}, []))  # --max-minutes ran out before any seed ended
    out = tmp_path / "figures.json"
    argv = ["--nodes", "n.csv", "--pods", "p.csv", "--model", str(DEFAULT_MODEL), "--max-minutes", "0.5"]
    assert bench.main([*argv, "--json", str(out)]) == 1
    err = capsys.readouterr().err
    assert "no branched states to measure (0 seeds played before --max-minutes 0.5 ran out)" in err
    assert not out.exists()
