"""benchmarks/maskable_ppo_crosscheck.py: our run's "start" model is the policy the run starts from
(sb3-contrib is not needed for this part)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark
from ppo_fixtures import small_typical, write_workload

from rlsched.policy.export import read_model, save_model
from rlsched.policy.learned import DEFAULT_MODEL

pytest.importorskip("torch")


def test_the_start_of_a_run_from_a_model_has_that_models_settings(tmp_path: Path) -> None:
    """train() adopts the init model's rank scale (prepare_args → settings_of_init_model); the start
    model exported beside it, evaluated as the run's "before", must have it too, not Args' default."""
    bench = load_benchmark("maskable_ppo_crosscheck")
    params, manifest, _ = read_model(DEFAULT_MODEL)
    tuned = {**manifest, "version": "tuned-rank", "decision": {**manifest["decision"], "rankScale": 126.0}}
    init = tmp_path / "tuned.npz"
    save_model(init, params, tuned)
    nodes, pods = write_workload(tmp_path / "workload")
    a = argparse.Namespace(
        out=str(tmp_path / "out"), pods=pods, budget_minutes=1.0, lr=3e-4, frag_weight=0.0, init_model=str(init)
    )
    args = bench.ours_args("ours-init", Path(nodes), a, 1)
    assert args.rank_scale == 126.0 and args.init_model == str(init)
    start = bench.export_start("ours-init", args, small_typical(), 1)
    _, started, _ = read_model(start)
    assert started["decision"]["rankScale"] == 126.0
