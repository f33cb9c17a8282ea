"""What a PPO run leaves in its folder: a checkpoint to resume from however the run stopped, never a
half-written one, and models whose version names the step they were exported at."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from ppo_fixtures import tiny_args  # noqa: E402

from rlsched.policy.export import read_model  # noqa: E402
from rlsched.policy.ppo import train  # noqa: E402
from rlsched.policy.ppo.trainer import load_checkpoint  # noqa: E402

VINE: dict[str, Any] = dict(advantage="vine", vine_trunks=1, vine_points=2, vine_actions=2, vine_window=(0.3, 0.9))
"""A vine run of two branch states per iteration on the small cluster."""


def test_vine_stopped_by_max_iterations_leaves_a_checkpoint(tmp_path: Path) -> None:
    """The vine loop wrote its checkpoint only every ``checkpoint_every`` iterations, so a run stopped
    before (``--max-iterations``, ``--max-minutes``) could not be resumed; the GAE loop writes one at the end."""
    first = train(tiny_args(tmp_path, **VINE, total_timesteps=100, max_iterations=1, checkpoint_every=5, eval_every=0))
    checkpoint = Path(first.run_dir) / "checkpoint.pt"
    assert load_checkpoint(checkpoint)["iteration"] == 1
    resumed = train(tiny_args(tmp_path, **VINE, resume=str(checkpoint), max_iterations=1, eval_every=0))
    assert [row["iteration"] for row in resumed.history] == [1, 2]
    assert load_checkpoint(checkpoint)["iteration"] == 2


class Crash(Exception):
    """The process dying while it writes."""


@pytest.mark.parametrize("advantage", ["gae", "vine"])
def test_a_checkpoint_write_that_dies_leaves_the_last_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, advantage: str
) -> None:
    """The second checkpoint write dies after its first bytes: the first checkpoint must still resume (the
    vine loop wrote over checkpoint.pt in place), and no temporary file is left."""
    real_save = torch.save
    calls = []

    def dies_on_the_second(obj: Any, f: Any, *args: Any, **kw: Any) -> None:
        calls.append(f)
        if len(calls) == 2:
            Path(f).write_bytes(b"PK\x03\x04partial")
            raise Crash
        real_save(obj, f, *args, **kw)

    monkeypatch.setattr(torch, "save", dies_on_the_second)
    extra = VINE if advantage == "vine" else {}
    args = tiny_args(tmp_path, **extra, checkpoint_every=1, max_iterations=3, eval_every=0, total_timesteps=1000)
    with pytest.raises(Crash):
        train(args)
    run_dir = Path(args.out_dir) / f"{args.exp_name}-s{args.seed}"
    assert load_checkpoint(run_dir / "checkpoint.pt")["iteration"] == 1
    assert not list(run_dir.glob("*.tmp"))


@pytest.mark.parametrize("advantage", ["gae", "vine"])
def test_the_default_version_names_the_step_of_the_export(tmp_path: Path, advantage: str) -> None:
    """``<exp_name>-s<seed>-<steps>`` as --model-version's help says (best.npz and final.npz both read
    ``tiny-s3`` whatever weights they held); the steps are the decisions the run reports (vine: branch
    states), at the export."""
    extra = VINE if advantage == "vine" else {}
    result = train(tiny_args(tmp_path, **extra, total_timesteps=192 if advantage == "gae" else 6, eval_every=1))
    _, final, _ = read_model(Path(result.run_dir) / "final.npz")
    assert final["version"] == f"tiny-s3-{result.steps}"
    _, best, _ = read_model(Path(result.run_dir) / "best.npz")
    training = best["training"]
    steps = training["globalStep"] if advantage == "gae" else training["iteration"] * 2
    assert best["version"] == f"tiny-s3-{steps}"
    named = train(tiny_args(tmp_path / "named", **extra, total_timesteps=64, model_version="mine-v1", eval_every=0))
    for name in ("best", "final"):
        assert read_model(Path(named.run_dir) / f"{name}.npz")[1]["version"] == "mine-v1"
