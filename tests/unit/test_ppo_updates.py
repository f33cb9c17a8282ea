"""What the updates see: the score head's step size without annealing, minibatches of near-equal size,
every trace in a vine run, and behaviour cloning that offers delay where the logging policy could."""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ppo_fixtures import small_nodes, small_pods, small_typical, tiny_args, write_workload  # noqa: E402

import rlsched.policy.ppo.trainer as gae  # noqa: E402
import rlsched.policy.ppo.vine as vine  # noqa: E402
import rlsched.policy.ppo.vine_trainer as vine_trainer  # noqa: E402
from rlsched.cli import main as cli_main  # noqa: E402
from rlsched.policy.env import EnvConfig, SchedulingCore  # noqa: E402
from rlsched.policy.ppo import Args, DecisionRecord, fit_from_records, train  # noqa: E402
from rlsched.policy.ppo.buffer import RolloutBuffer  # noqa: E402
from rlsched.policy.trace import dump_generic  # noqa: E402


def test_head_lr_scale_applies_without_annealing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []
    make = gae.make_optimizer
    monkeypatch.setattr(gae, "make_optimizer", lambda agent, args: made.append(make(agent, args)) or made[-1])
    train(tiny_args(tmp_path, anneal_lr=False, head_lr_scale=10.0, learning_rate=1e-3, max_iterations=1, eval_every=0))
    rest, head = (g["lr"] for g in made[0].param_groups)
    assert (rest, head) == pytest.approx((1e-3, 1e-2))


def test_minibatches_split_the_batch_evenly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of 64 in 3 minibatches: 22, 21, 21 (not 21, 21, 21 and a step on 1 sample)."""
    sizes: collections.Counter[int] = collections.Counter()
    batch = RolloutBuffer.batch

    def counted(self: RolloutBuffer, idx: np.ndarray) -> Any:
        sizes[len(idx)] += 1
        return batch(self, idx)

    monkeypatch.setattr(RolloutBuffer, "batch", counted)
    args = tiny_args(tmp_path, num_minibatches=3, update_epochs=1, max_iterations=1, eval_every=0, target_kl=None)
    train(args)
    assert sizes == {22: 1, 21: 2}


def test_more_minibatches_than_decisions_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="num_minibatches"):
        train(tiny_args(tmp_path, num_envs=1, num_steps=4, num_minibatches=8, max_iterations=1))
    args = tiny_args(tmp_path)
    argv = ["train", "--method", "ppo", "--nodes", args.nodes, "--traces", *args.traces]
    assert cli_main([*argv, "--num-envs", "1", "--num-steps", "4", "--num-minibatches", "8"]) == 2
    assert "--num-minibatches (8) must be at most the batch" in capsys.readouterr().err


def test_vine_plays_every_trace_in_even_minibatches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Trunk ``t`` plays trace ``t mod len(traces)``, as env ``e`` does in the GAE loop; each epoch's
    pairs are split into exactly ``num_minibatches`` near-equal parts."""
    other = tmp_path / "b" / "other.json"
    other.parent.mkdir(parents=True)
    other.write_text(dump_generic(small_nodes(), small_pods(120, seed=7)))
    played: list[str] = []
    collect = vine.collect_trunk

    def spy(net: Any, core: Any, *a: Any) -> Any:
        played.append(core.name)
        return collect(net, core, *a)

    monkeypatch.setattr(vine, "collect_trunk", spy)
    steps: list[int] = []
    loss = vine.vine_loss

    def counted(agent: Any, batch: Any, pairs: np.ndarray, *a: Any) -> Any:
        steps.append(len(pairs))
        return loss(agent, batch, pairs, *a)

    monkeypatch.setattr(vine_trainer, "vine_loss", counted)
    _, first = write_workload(tmp_path / "a")
    args = tiny_args(
        tmp_path / "a",
        traces=(first, str(other)),
        advantage="vine",
        vine_trunks=2,
        vine_points=4,
        vine_actions=3,
        vine_window=(0.3, 0.9),
        num_minibatches=4,
        update_epochs=1,
        max_iterations=1,
        eval_every=0,
        target_kl=None,
    )
    train(args)
    assert played == ["cluster", "other"]
    assert len(steps) == 4 and max(steps) - min(steps) <= 1


def logged_decisions(delay_every: int = 10) -> list[DecisionRecord]:
    """Two episodes of the small cluster as a log: every ``delay_every``-th decision a delay."""
    core = SchedulingCore(small_nodes(), small_pods(), small_typical(), EnvConfig())
    records: list[DecisionRecord] = []
    for seed in (1, 2):
        core.reset(seed)
        while not core.done:
            cand = core.candidates
            action = -1 if len(records) % delay_every == 0 else int(np.argmin(cand.features[:, 0]))
            records.append(DecisionRecord(cand.features, cand.prior, action, count=cand.count.astype(float)))
            core.step_node(int(cand.nodes[cand.rep[max(action, 0)]]))
    return records


def test_cloning_offers_delay_wherever_the_logging_policy_could() -> None:
    """A log with a delay in every tenth decision: delay was on offer at every one. Offered only where it
    was taken, cloning would only ever push it up (the cloned policy then delayed most of the time)."""
    records = logged_decisions()
    assert gae.records_buffer(records).special_mask[:, 0, 0].all()
    no_delays = [r for r in records if r.action != -1]
    assert not gae.records_buffer(no_delays).special_mask[:, 0, 0].any()
    assert gae.records_buffer(no_delays, allow_delay=True).special_mask[:, 0, 0].all()
    said = [dataclasses.replace(r, offered=(False, True)) for r in no_delays[:3]]
    assert gae.records_buffer(said, allow_delay=True).special_mask[:, 0].tolist() == [[False, True]] * 3

    agent = fit_from_records(records, Args(hidden=(16, 16), value_hidden=16, seed=0), epochs=10, learning_rate=3e-3)
    b, _ = gae.records_buffer(records).batch(np.arange(len(records)))
    with torch.no_grad():
        _, logprob, _, _ = agent.get_action_and_value(b, torch.full((len(records),), -1, dtype=torch.int64))
    assert float(logprob.exp().mean()) < 0.3  # the logged rate is 0.1
