"""``max_minutes`` holds: the loops keep the final validation in reserve even when they have not timed one
(``eval_every=0``), and after ``--resume``. The trainers' clock is replaced by one that only the
simulated work moves, so the figures are exact and the tests fast."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from ppo_fixtures import tiny_args  # noqa: E402

import rlsched.policy.ppo.trainer as gae  # noqa: E402
import rlsched.policy.ppo.vine_trainer as vine  # noqa: E402

BUDGET_MIN = 0.1
"""6 seconds of the fake clock."""


class Clock:
    """Stands in for the ``time`` module: seconds pass only when the test says."""

    def __init__(self) -> None:
        self.now = 0.0

    def time(self) -> float:
        return self.now


@pytest.fixture
def gae_clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """Every decision the GAE trainer plays (rollout or validation) takes 10 ms."""
    clock = Clock()
    monkeypatch.setattr(gae, "time", clock)
    act = gae.act

    def timed_act(*a: Any, **kw: Any) -> dict[str, Any]:
        clock.now += 0.01
        return act(*a, **kw)

    monkeypatch.setattr(gae, "act", timed_act)
    return clock


def budget_args(folder: Path, **kw: Any) -> Any:
    # validation: 3 episodes of ~100 decisions, far longer than an iteration's 64 stored decisions
    return tiny_args(folder, eval_every=0, val_seeds=(5, 6, 7), total_timesteps=64 * 100, **kw)


def test_gae_without_validations_keeps_the_final_one_in_reserve(tmp_path: Path, gae_clock: Clock) -> None:
    result = gae.train(budget_args(tmp_path, max_minutes=BUDGET_MIN))
    assert len(result.history) >= 1
    assert result.seconds <= BUDGET_MIN * 60


def test_gae_resume_keeps_the_runs_timings(tmp_path: Path, gae_clock: Clock) -> None:
    """A checkpoint with too little of the budget left for an iteration and the final validation: the
    resumed run validates and stops (an unmeasured iteration and validation used to count as free)."""
    first = gae.train(budget_args(tmp_path, max_iterations=1))
    ckpt_path = Path(first.run_dir) / "checkpoint.pt"
    ckpt = torch.load(ckpt_path, weights_only=False)
    ckpt["elapsed"] = BUDGET_MIN * 60 - 0.5
    torch.save(ckpt, ckpt_path)
    resumed = gae.train(budget_args(tmp_path, max_minutes=BUDGET_MIN, resume=str(ckpt_path)))
    assert len(resumed.history) == len(first.history)  # no further iteration


def test_vine_keeps_an_iteration_and_the_final_validation_in_reserve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each trunk takes 1 s and each validation episode 0.5 s: after a 2 s iteration, one more and the
    final validation (1.5 s) would pass the 6 s; the run stops and validates within them."""
    clock = Clock()
    monkeypatch.setattr(vine, "time", clock)
    trunk, validate = vine.trunk_job, vine.validate_mode

    def timed_trunk(job: dict[str, Any]) -> Any:
        clock.now += 1.0
        return trunk(job)

    def timed_validate(net: Any, args: Any, seeds: Any, core: Any) -> list[float]:
        clock.now += 0.5 * len(seeds)
        return validate(net, args, seeds, core)

    monkeypatch.setattr(vine, "trunk_job", timed_trunk)
    monkeypatch.setattr(vine, "validate_mode", timed_validate)
    args = tiny_args(
        tmp_path,
        advantage="vine",
        vine_trunks=2,
        vine_points=2,
        vine_actions=2,
        vine_window=(0.3, 0.9),
        eval_every=0,
        val_seeds=(5, 6, 7),
        total_timesteps=10_000,
        max_minutes=BUDGET_MIN,
    )
    result = vine.train_vine(args)
    assert len(result.history) >= 1
    assert result.seconds <= BUDGET_MIN * 60
