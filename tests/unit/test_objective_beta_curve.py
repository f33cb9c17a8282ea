"""benchmarks/objective_beta_curve.py: the objective recomputed per β from evaluation JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from benchmark_scripts import load_benchmark


def load_script() -> Any:
    return load_benchmark("objective_beta_curve")


def run(policy: str, seed: int, wait: float, cost: float, hot: float = 10.0, stranded: float = 4.0) -> dict:
    return {"policy": policy, "seed": seed, "wait_mean_s": wait, "cost_pct": cost, "sla_hot_node_pct": hot,
            "stranded_gpu_pct": stranded}  # fmt: skip


def write(path: Path, runs: list[dict]) -> Path:
    path.write_text(json.dumps({"settings": {}, "runs": runs}))
    return path


def test_cheap_but_slow_wins_at_low_beta_and_fast_but_dear_at_high(tmp_path: Path, capsys: Any) -> None:
    script = load_script()
    # "packer": 90 % cost, waits 150 s; "spreader": 100 % cost, waits 0 s (latency scale 300 s)
    # β = 0: −(0.90 + 0.14) vs −(1.00 + 0.14) → packer; β = 1: −(0.5 + 0.14) vs −(0 + 0.14) → spreader
    a = write(tmp_path / "a.json", [run("packer", s, 150 + s, 90) for s in range(1, 6)])
    b = write(tmp_path / "b.json", [run("spreader", s, 0, 100) for s in range(1, 6)] + [run("spreader", 9, 0, 100)])
    assert script.main([str(a), str(b), "--betas", "0,1", "--out", str(tmp_path / "curve")]) == 0
    data = json.loads((tmp_path / "curve.json").read_text())
    assert data["seeds"] == [1, 2, 3, 4, 5]  # seed 9 only one policy has: left out, with a warning
    low, high = data["rows"]
    assert (low["best"], low["best_wins"], low["best_losses"]) == ("packer", 5, 0)
    assert low["median"]["packer"] == pytest.approx(-(0.90 + 0.14))
    assert (high["best"], high["runner_up"]) == ("spreader", "packer")
    assert high["median"]["packer"] == pytest.approx(-(153 / 300 + 0.14))
    assert (tmp_path / "curve.png").stat().st_size > 0 and "| 0.00 |" in (tmp_path / "curve.md").read_text()
    assert (tmp_path / "curve.md").read_text().startswith("# The combined objective over β: median × 100 over seeds")
    assert "seeds [9]" in capsys.readouterr().err


def test_the_weights_come_from_a_scheduling_policy(tmp_path: Path) -> None:
    script = load_script()
    a = write(tmp_path / "a.json", [run("x", 1, 0, 90, hot=10), run("y", 1, 0, 95, hot=0)])
    policy = tmp_path / "policy.yaml"
    policy.write_text("kind: SchedulingPolicy\nspec: {objective: {slaWeight: 0}}\n")
    assert script.main([str(a), "--betas", "0", "--objective-from", str(policy), "--out", str(tmp_path / "c")]) == 0
    assert json.loads((tmp_path / "c.json").read_text())["rows"][0]["best"] == "x"  # hot time no longer counts
    assert script.main([str(a), "--betas", "0", "--out", str(tmp_path / "d")]) == 0
    assert json.loads((tmp_path / "d.json").read_text())["rows"][0]["best"] == "y"


def test_bad_input_is_refused(tmp_path: Path, capsys: Any) -> None:
    script = load_script()
    one = write(tmp_path / "one.json", [run("x", 1, 0, 90)])
    assert script.main([str(one)]) == 2 and "at least two policies" in capsys.readouterr().err
    assert script.main([str(one), "--betas", "2"]) == 2 and "from 0 to 1" in capsys.readouterr().err


def test_a_learned_model_is_compared_with_its_prior_seed_by_seed(tmp_path: Path) -> None:
    script = load_script()
    runs = [run("ppo:m.npz", s, 0, 90 - (s == 1) * 5) for s in range(1, 4)]
    runs += [run("ppo-prior:m.npz", s, 0, 90) for s in range(1, 4)] + [run("fgd", s, 0, 99) for s in range(1, 4)]
    assert script.main([str(write(tmp_path / "a.json", runs)), "--betas", "0", "--out", str(tmp_path / "c")]) == 0
    row = json.loads((tmp_path / "c.json").read_text())["rows"][0]
    assert row["learned_vs_prior"] == {"ppo:m.npz": [1, 0]}  # better on seed 1, tied on 2 and 3
    assert "ppo:m vs its prior, wins/losses" in (tmp_path / "c.md").read_text()
