"""A PPO run's settings: a resumed run keeps the ones it started with, and a run from a model takes that
model's own — its scales, decision rule, special actions and learned delay head — from ``rlsched
train`` and from the Python API alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ppo_fixtures import small_typical, tiny_args  # noqa: E402

from rlsched.cli import main as cli_main  # noqa: E402
from rlsched.policy.delay_head import DELAY_INPUTS, DelayHead  # noqa: E402
from rlsched.policy.export import build_manifest, read_model, save_model  # noqa: E402
from rlsched.policy.features import CLUSTER_FEATURES, FEATURES  # noqa: E402
from rlsched.policy.learned import load_learned_scorer  # noqa: E402
from rlsched.policy.ppo import train  # noqa: E402
from rlsched.policy.ppo.agent import Agent  # noqa: E402


def start_model(
    path: Path, head: DelayHead | None = None, training: dict[str, Any] | None = None, **settings: Any
) -> Path:
    """A fresh 16-16-16 network written as a model file with the given manifest settings (and delay head)."""
    torch.manual_seed(0)
    arrays = Agent(len(FEATURES), len(CLUSTER_FEATURES), (16, 16), 16, 50.0).to_arrays()
    shape: dict[str, Any] = dict(prior_scale=50.0, rank_scale=20.0, mode="greedy", fgd_cpu_weight=0.8)
    manifest = build_manifest(
        version="start",
        hidden=(16, 16),
        value_hidden=16,
        typical_json=small_typical().to_json(),
        training=training or {},
        **{**shape, **settings},
    )
    if head is not None:
        arrays = {**arrays, **head.arrays()}
        manifest["delayHead"] = head.manifest({"test": True})
    save_model(path, arrays, manifest)
    return path


def test_resume_continues_with_the_runs_own_settings(tmp_path: Path) -> None:
    """The second invocation names only the checkpoint (the rest at their defaults, as a user would):
    the run goes on with the settings it started with (test_train_smoke: then it ends bit for bit where
    an uninterrupted run does)."""
    own = dict(prior_scale=5.0, rank_scale=5.0, gamma=0.9, learning_rate=3e-4, eval_every=0, total_timesteps=128)
    first = train(tiny_args(tmp_path, **own, max_iterations=1))
    ckpt = Path(first.run_dir) / "checkpoint.pt"
    resumed = train(tiny_args(tmp_path, resume=str(ckpt), eval_every=0))
    assert resumed.steps == 128
    run_dir = Path(resumed.run_dir)
    final = json.loads((run_dir / "final.json").read_text())
    assert final["network"]["priorScale"] == 5.0 and final["decision"]["rankScale"] == 5.0
    saved = json.loads((run_dir / "args.json").read_text())
    assert (saved["gamma"], saved["learning_rate"], saved["max_iterations"]) == (0.9, 3e-4, 0)
    lrs = [g["lr"] for g in torch.load(ckpt, weights_only=False)["optimizer"]["param_groups"]]
    assert lrs == pytest.approx([3e-4 * 0.5, 3e-4 * 0.5])  # annealed over the run's 2 iterations, at its rate


def test_ppo_from_a_model_keeps_its_delay_head_actions_hold_and_mode(tmp_path: Path) -> None:
    n = len(DELAY_INPUTS)
    head = DelayHead(np.zeros(n), np.ones(n), np.arange(n, dtype=float) / 10, -0.5, hold_s=30.0)
    init = start_model(
        tmp_path / "start.npz", head, training={"args": {"hold_s": 30.0}}, allow_delay=True, mode="sample"
    )
    args = tiny_args(tmp_path)
    argv = ["train", "--method", "ppo", "--init", str(init), "--nodes", args.nodes, "--traces", *args.traces]
    argv += ["--out-dir", args.out_dir, "--exp-name", "tiny", "--no-progress", "--workers", "1", "--val-seeds", "5"]
    argv += ["--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1"]
    argv += ["--max-iterations", "1", "--eval-every", "1", "--end-at", "1.0", "--learn-from", "0.3"]
    assert cli_main(argv) == 0
    for name in ("best", "final"):
        path = Path(args.out_dir) / "tiny-s1" / f"{name}.npz"
        arrays, manifest, _ = read_model(path)
        for k, v in head.arrays().items():
            np.testing.assert_array_equal(arrays[k], v, err_msg=f"{name} {k}")
        assert manifest["delayHead"] == head.manifest({"test": True})
        assert manifest["actions"]["delay"] is True and manifest["decision"]["mode"] == "sample"
        assert manifest["training"]["args"]["hold_s"] == 30.0
        scorer = load_learned_scorer(path)
        assert scorer.delay_head is not None and scorer.hold_s == 30.0


def test_the_api_starts_from_the_init_models_settings(tmp_path: Path) -> None:
    """``train(Args(init_model=...))`` takes the model's scales as ``rlsched train --init`` does."""
    init = start_model(tmp_path / "start.npz", prior_scale=7.0, rank_scale=13.0, fgd_cpu_weight=0.3)
    result = train(tiny_args(tmp_path, init_model=str(init), max_iterations=1, eval_every=1))
    _, best, _ = read_model(result.model_path)
    assert best["network"]["priorScale"] == 7.0
    assert best["decision"]["rankScale"] == 13.0
    assert best["features"]["fgdCpuWeight"] == 0.3
