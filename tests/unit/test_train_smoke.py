"""A tiny PPO run on a small synthetic cluster: the loop runs, losses are finite, the export loads,
a resumed run ends exactly where an uninterrupted one does, and the offline seam fits records."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ppo_fixtures import small_nodes, small_pods, small_typical, tiny_args, write_workload  # noqa: E402

from rlsched.cli import main as cli_main  # noqa: E402
from rlsched.policy.env import EnvConfig, SchedulingCore  # noqa: E402
from rlsched.policy.features import NUM_FEATURES  # noqa: E402
from rlsched.policy.learned import load_learned_scorer  # noqa: E402
from rlsched.policy.ppo import Args, DecisionRecord, fit_from_records, train  # noqa: E402
from rlsched.policy.ppo.agent import Agent  # noqa: E402


def params_of(agent_path: Path) -> dict[str, np.ndarray]:
    ckpt = torch.load(agent_path, weights_only=False)
    return {k: v.numpy() for k, v in ckpt["agent"].items()}


def test_tiny_run_resume_and_export(tmp_path: Path) -> None:
    full = train(tiny_args(tmp_path / "a"))
    assert full.steps == 256 and len(full.history) == 5  # iteration 0: validation of the start
    for row in full.history[1:]:
        for key in ("pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac", "sps"):
            assert np.isfinite(row[key]), (key, row)
    run_dir = Path(full.run_dir)
    assert (run_dir / "learning_curves.png").stat().st_size > 0
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 4
    scorer = load_learned_scorer(full.model_path)
    assert scorer.manifest["training"]["args"]["seed"] == 3

    # the same run in two invocations: stop after 2 iterations, then resume
    args = tiny_args(tmp_path / "b", max_iterations=2)
    first = train(args)
    assert first.steps == 128
    ckpt = Path(first.run_dir) / "checkpoint.pt"
    second = train(tiny_args(tmp_path / "b", resume=str(ckpt)))
    assert second.steps == 256
    a, b = params_of(run_dir / "checkpoint.pt"), params_of(ckpt)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_cli_train_with_config(tmp_path: Path, capsys) -> None:
    nodes, pods = write_workload(tmp_path)
    config = tmp_path / "train.yaml"
    config.write_text(
        json.dumps(
            {
                "exp-name": "cli",
                "nodes": nodes,
                "traces": [pods],
                "num_envs": 1,
                "num_steps": 16,
                "total_timesteps": 32,
                "hidden": [8, 8],
                "value_hidden": 8,
                "eval_every": 0,
                "val_seeds": [1],
                "out_dir": str(tmp_path / "runs"),
                "progress": False,
            }
        )
    )
    out = tmp_path / "model.npz"
    assert cli_main(["train", "--config", str(config), "--seed", "2", "--export", str(out)]) == 0
    assert out.is_file() and out.with_suffix(".json").is_file()
    assert load_learned_scorer(out).manifest["training"]["args"]["seed"] == 2
    capsys.readouterr()
    assert cli_main(["train", "--config", str(config), "--nodes", str(tmp_path / "missing.csv")]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("learning_rat: 0.1\n")
    assert cli_main(["train", "--config", str(bad)]) == 2
    assert "unknown setting" in capsys.readouterr().err


def test_fit_from_records_learns_the_logged_choice() -> None:
    """Behaviour cloning on decisions logged from the simulator raises the log-probability of the logged action."""
    core = SchedulingCore(small_nodes(), small_pods(), small_typical(), EnvConfig())
    core.reset(1)
    records = []
    while not core.done and len(records) < 60:
        cand = core.candidates
        action = int(np.argmin(cand.features[:, 0] + cand.features[:, 15]))  # some fixed rule to imitate
        records.append(
            DecisionRecord(features=cand.features, prior=cand.prior, action=action, count=cand.count.astype(float))
        )
        core.step_node(int(cand.nodes[cand.rep[action]]))
    args = Args(hidden=(16, 16), value_hidden=16, prior_scale=0.0, seed=0)
    start = Agent(NUM_FEATURES, 6, (16, 16), 16, 0.0)
    before = mean_logprob(start, records)
    agent = fit_from_records(records, args, epochs=30, batch=32, learning_rate=3e-3)
    assert mean_logprob(agent, records) > before + 0.1
    with pytest.raises(ValueError, match="record 0"):
        fit_from_records([DecisionRecord(features=np.zeros((2, 3), np.float32), prior=np.zeros(2), action=0)], args)


def mean_logprob(agent: Agent, records: list[DecisionRecord]) -> float:
    from rlsched.policy.features import CLUSTER_SLICE
    from rlsched.policy.ppo.buffer import RolloutBuffer

    buf = RolloutBuffer(len(records), 1, NUM_FEATURES, 6)
    for t, r in enumerate(records):
        g = len(r.features)
        buf.add(
            t,
            0,
            r.features,
            r.prior,
            np.zeros(g),
            r.count,
            r.features[0, CLUSTER_SLICE],
            np.zeros(2, bool),
            r.action,
            0,
            0,
        )
    b, extra = buf.batch(np.arange(len(records)))
    with torch.no_grad():
        return float(agent.get_action_and_value(b, extra["actions"])[1].mean())


def test_train_takes_the_adaptation_spellings(tmp_path: Path) -> None:
    """``--pods`` and ``--init`` (the words of "teach the scheduler my cluster") set traces and init_model."""
    import argparse

    from rlsched.policy.cli_train import add_arguments, build_args

    nodes, pods = write_workload(tmp_path)
    model = tmp_path / "start.npz"
    model.write_bytes(b"")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = build_args(parser.parse_args(["--nodes", nodes, "--pods", pods, pods, "--init", str(model)]))
    assert args.traces == (pods, pods)
    assert args.init_model == str(model)
    with pytest.raises(SystemExit):
        parser.parse_args(["--pods"])


def test_train_plays_episodes_on_every_core_unless_told(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--workers`` left out (0) becomes one process per core, the count the manifest then records."""
    import argparse

    import rlsched.policy.evaluate
    from rlsched.policy.cli_train import add_arguments, build_args

    monkeypatch.setattr(rlsched.policy.evaluate, "default_jobs", lambda: 6)
    nodes, pods = write_workload(tmp_path)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert build_args(parser.parse_args(["--nodes", nodes, "--pods", pods])).workers == 6
    assert build_args(parser.parse_args(["--nodes", nodes, "--pods", pods, "--workers", "2"])).workers == 2
    with pytest.raises(ValueError, match="--workers must be 0"):
        build_args(parser.parse_args(["--nodes", nodes, "--pods", pods, "--workers", "-1"]))
