"""benchmarks/es_variants_report.py: the adaptation table from a fine-tuning run and its evaluations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from benchmark_scripts import load_benchmark


def load_script() -> Any:
    return load_benchmark("es_variants_report")


def evaluation(path: Path, values: dict[str, list[float]], pods: str = "variant.csv") -> Path:
    runs = [
        {"policy": policy, "seed": 42 + i, "unallocated_gpu_pct_at_100": v}
        for policy, vs in values.items()
        for i, v in enumerate(vs)
    ]
    path.write_text(json.dumps({"nodes": "nodes.csv", "pods": pods, "inflation_target": 1.3, "runs": runs}))
    return path


def fine_tuning_run(tmp_path: Path, start: Path) -> tuple[Path, Path]:
    """A run directory as ``rlsched train --method es`` leaves it, and its export (``--export``)."""
    manifest = {
        "version": "half-s1-es7",
        "decision": {"rankScale": 90.0},
        "training": {
            "init": {"path": str(start)},
            "iterations": 10,
            "bestIteration": 7,
            "args": {"workers": 1},
            "confirmation": {"exported": True, "candidateBetterOn": 6, "candidateWorseOn": 2},
        },
    }
    run_dir = tmp_path / "half-s1"
    run_dir.mkdir()
    (run_dir / "best.json").write_text(json.dumps(manifest))
    rows = [{"iteration": 0, "val": 4.2, "rank_scale": 80.0, "head_l1": 0.5}, {"iteration": 1, "fitness_mean": -4.1}]
    rows += [{"iteration": 7, "val": 4.1, "rank_scale": 90.0, "head_l1": 3.0, "seconds": 60.0}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    export = tmp_path / "half.npz"
    export.with_suffix(".json").write_text(json.dumps(manifest))
    return run_dir, export


def test_the_table_pairs_the_fine_tuned_model_with_each_column_seed_by_seed(tmp_path: Path, capsys: Any) -> None:
    script = load_script()
    start = tmp_path / "bundled.npz"
    run_dir, export = fine_tuning_run(tmp_path, start)
    ours = evaluation(
        tmp_path / "eval.json",
        {
            f"ppo:{export}": [4.0, 4.1, 4.2],
            f"ppo-prior:{export}": [4.1, 4.1, 4.1],  # better on 42 (−0.1), equal on 43, worse on 44 (+0.1)
            f"ppo-prior:{start}": [4.2, 4.3, 4.2],  # −0.2, −0.2, 0.0: better on 2, equal on 1
            "fgd-cpu": [4.5, 4.5, 4.5],
        },
    )
    fgd = evaluation(tmp_path / "fgd.json", {"fgd": [5.0, 5.5, 5.0], "bestfit": [7.0, 7.0, 7.0]})
    out = tmp_path / "variants.json"
    assert script.main([f"half={run_dir}:{ours}+{fgd}", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    # medians: 4.1, 4.1, 4.2, 4.5, 5.0; the lowest (4.10, twice) in bold
    row = "| half | **4.10** | **4.10** | 4.20 | 4.50 | 5.00 | "
    assert row + "1, worse on 1 (+0.00) / 2 (-0.20) / 3 (-0.40) / 3 (-1.00) |" in printed
    report = json.loads(out.read_text())["variants"]["half"]
    assert report["fineTunedAgainst"]["hand rule"] == {"better": 2, "worse": 0, "medianDifference": -0.2}
    assert report["confirmation"]["exported"] and report["bestIteration"] == 7 and report["rankScale"] == 90.0
    assert [v["iteration"] for v in report["validation"]] == [0, 7]
    assert report["evaluation"]["fgd"] == {"42": 5.0, "43": 5.5, "44": 5.0}  # bestfit is not a column


def test_an_evaluation_without_a_column_is_refused(tmp_path: Path) -> None:
    script = load_script()
    run_dir, export = fine_tuning_run(tmp_path, tmp_path / "bundled.npz")
    ours = evaluation(tmp_path / "eval.json", {f"ppo:{export}": [4.0], "fgd-cpu": [4.5], "fgd": [5.0]})
    with pytest.raises(SystemExit, match="lack network zeroed, hand rule"):
        script.main([f"half={run_dir}:{ours}"])


def test_evaluations_of_another_setup_are_not_merged(tmp_path: Path) -> None:
    """Evaluations were merged by policy name alone: fgd on another trace overwrote the variant's fgd."""
    script = load_script()
    ours = evaluation(tmp_path / "eval.json", {"fgd": [4.7]})
    other = evaluation(tmp_path / "other.json", {"fgd": [13.37]}, pods="gpushare100.csv")
    with pytest.raises(SystemExit, match="evaluates another setup"):
        script.per_seed([ours, other])
    again = evaluation(tmp_path / "again.json", {"fgd": [4.8]})
    with pytest.raises(SystemExit, match="fgd seed 42 is 4.8, another file says 4.7"):
        script.per_seed([ours, again])
