"""benchmarks/nodes_to_score.py: settings without 100 (the baseline) are refused before any run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from benchmark_scripts import load_benchmark
from ppo_fixtures import write_workload


@pytest.mark.parametrize("percentages", ["50,0", "ten"])
def test_percentages_without_the_baseline_are_refused_up_front(tmp_path: Path, capsys: Any, percentages: str) -> None:
    bench = load_benchmark("nodes_to_score")
    nodes, pods = write_workload(tmp_path / "workload")
    argv = ["--nodes", nodes, "--pods", pods, "--policy", "fgd", "--seeds", "1", "--jobs", "1"]
    with pytest.raises(SystemExit) as exit_:
        bench.main([*argv, "--percentages", percentages])
    assert exit_.value.code == 2
    assert "--percentages" in capsys.readouterr().err
