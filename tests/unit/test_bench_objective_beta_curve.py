"""benchmarks/objective_beta_curve.py: runs of policies that share no seed are refused with a message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmark_scripts import load_benchmark


def write(path: Path, policy: str, seeds: range) -> Path:
    runs = [
        {"policy": policy, "seed": s, "wait_mean_s": 10.0, "cost_pct": 50.0, "sla_hot_node_pct": 1.0,
         "stranded_gpu_pct": 3.0}
        for s in seeds
    ]  # fmt: skip
    path.write_text(json.dumps({"settings": {}, "runs": runs}))
    return path


def test_policies_without_a_shared_seed_stop_with_an_error(tmp_path: Path, capsys: Any) -> None:
    script = load_benchmark("objective_beta_curve")
    a = write(tmp_path / "a.json", "fgd", range(42, 52))
    b = write(tmp_path / "b.json", "bestfit", range(100, 110))
    assert script.main([str(a), str(b), "--out", str(tmp_path / "curve")]) == 2
    err = capsys.readouterr().err
    assert "no seed is in every policy's runs" in err and "fgd: seeds 42–51 (10)" in err
    assert not (tmp_path / "curve.json").exists()
