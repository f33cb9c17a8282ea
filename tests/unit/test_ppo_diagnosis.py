"""benchmarks/ppo_diagnosis.py: branched states saved by one run are what a ``--from-points`` run reads."""

from __future__ import annotations

import json
from pathlib import Path

from benchmark_scripts import load_benchmark
from ppo_fixtures import write_workload

from rlsched.policy.learned import DEFAULT_MODEL


def test_saved_points_give_the_same_figures_without_playing(tmp_path: Path) -> None:
    bench = load_benchmark("ppo_diagnosis")
    nodes, pods = write_workload(tmp_path / "workload")
    played = tmp_path / "played.json"
    common = ["--model", str(DEFAULT_MODEL)]
    argv = ["--nodes", nodes, "--pods", pods, "--seeds", "1-3", "--points", "3", "--window", "0.3", "0.9"]
    assert bench.main([*argv, *common, "--save-points", str(tmp_path / "p.pkl"), "--json", str(played)]) == 0
    # Nothing to play from: the files named by --nodes and --pods are gone, and other seeds are asked for.
    Path(nodes).unlink()
    reread = tmp_path / "reread.json"
    again = ["--seeds", "7-9", "--from-points", str(tmp_path / "p.pkl"), "--json", str(reread)]
    assert bench.main([*again, *common]) == 0
    first, second = json.loads(played.read_text()), json.loads(reread.read_text())
    assert first.pop("seconds") >= 0 and second.pop("seconds") >= 0
    assert first["states"] == 9
    assert second == first
