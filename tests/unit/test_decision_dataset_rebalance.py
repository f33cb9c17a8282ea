"""The decision dataset and the rebalancer's ``rebalance`` lines: a pod the rebalancer moved is not
charged the eviction penalty against the decision that placed it (policy/decision_dataset.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlsched.policy.decision_dataset import FORMAT, REWARD_DEFAULTS, load_examples, reward, summarize

POD = {"uid": "u1", "namespace": "team", "name": "a"}


def write(tmp_path: Path, rebalance: dict[str, Any] | None, how: str = "evicted") -> Path:
    """One placement of ``POD``, bound where it was placed, then ended ``how``; with the rebalancer's
    line about it when given (between the binding and the end, as the operator writes them)."""
    lines: list[dict[str, Any]] = [
        {"type": "header", "format": "rlsched.decisions/v1"},
        {
            "type": "decision",
            "kind": "filter",
            "epoch": "e",
            "seq": 1,
            "time": 1.0,
            "pod": POD,
            "node": "n0",
            "cards": [0],
            "features": {},
        },
        {"type": "outcome", "event": "bound", "pod": POD, "node": "n0", "pendingSeconds": 0.0},
    ]
    if rebalance is not None:
        lines.append(
            {
                "type": "rebalance",
                "policy": "sched/default",
                "pod": POD,
                "owner": "team/ReplicaSet/a-rs",
                "from": "n0",
                "to": "n1",
                "reason": "fragmentation",
                "gain": 300.0,
                "dryRun": False,
                "time": 5000.0,
                **rebalance,
            }
        )
    lines.append({"type": "outcome", "event": "ended", "pod": POD, "how": how, "lifetimeSeconds": 5000.0})
    path = tmp_path / "segment-000001.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return tmp_path


PLACED = REWARD_DEFAULTS["placed"]
CHARGED = PLACED - REWARD_DEFAULTS["evicted"]


@pytest.mark.parametrize(
    ("rebalance", "how", "expected"),
    [
        (None, "evicted", CHARGED),  # evicted by someone else: the placement is charged
        ({"result": "evicted"}, "evicted", PLACED),  # the rebalancer moved it
        ({"result": "unknown"}, "evicted", PLACED),  # its answer was lost, but the pod was evicted
        ({"result": "dry_run", "dryRun": True}, "evicted", CHARGED),  # a preview moved nothing
        ({"result": "evicted", "dryRun": True}, "evicted", CHARGED),
        ({"result": "blocked_by_pdb"}, "evicted", CHARGED),  # refused: the later eviction is another's
        ({"result": "evicted"}, "preempted", CHARGED),  # the rebalancer does not preempt
    ],
)
def test_a_pod_the_rebalancer_moved_is_not_charged_for_its_eviction(
    tmp_path: Path, rebalance: dict[str, Any] | None, how: str, expected: float
) -> None:
    (example,) = load_examples(write(tmp_path, rebalance, how))
    assert example.outcome.ended == how and example.outcome.bound_node == "n0"
    assert reward(example) == pytest.approx(expected)


def test_the_summary_counts_rebalancer_moves_apart_from_evictions(tmp_path: Path) -> None:
    _, summary = summarize(write(tmp_path, {"result": "evicted"}))
    assert summary.evicted == 0 and summary.rebalanced == 1
    assert summary.mean_reward == pytest.approx(PLACED)
    assert "1 moved by the rebalancer" in summary.lines()[0]


def test_unreadable_rebalance_lines_are_ignored(tmp_path: Path) -> None:
    for bad in ({"result": "evicted", "pod": "u1"}, {"result": "evicted", "pod": {"uid": 5}}, {"result": ["evicted"]}):
        (example,) = load_examples(write(tmp_path, bad))
        assert not example.outcome.rebalanced and reward(example) == pytest.approx(CHARGED)


def test_an_eviction_long_after_a_lost_rebalance_answer_is_charged(tmp_path: Path) -> None:
    """A rebalance line whose answer was lost (the pod may not have been evicted) excused any later
    eviction of the pod: the kubelet's, six hours later under node pressure, went uncharged."""
    pod = {"uid": "u", "namespace": "ns", "name": "p"}
    lines = [
        {"type": "header", "format": FORMAT, "created": 0},
        {
            "type": "decision",
            "epoch": "1",
            "seq": 1,
            "loggedAt": 0,
            "kind": "filter",
            "pod": pod,
            "node": "n1",
            "time": 0,
        },
        {"type": "outcome", "event": "bound", "pod": pod, "node": "n1", "time": 1, "pendingSeconds": 1},
        {"type": "rebalance", "pod": pod, "result": "unknown", "dryRun": False, "time": 1000},
        {"type": "outcome", "event": "ended", "how": "evicted", "pod": pod, "time": 22600, "lifetimeSeconds": 22599},
    ]
    folder = tmp_path / "log"
    folder.mkdir()
    (folder / "segment-0000000000001-000001.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (example,) = load_examples(folder)
    assert not example.outcome.rebalanced and reward(example) < 0
    # the same eviction seconds after the line is the rebalancer's
    lines[-1] = {**lines[-1], "time": 1003}
    (folder / "segment-0000000000001-000001.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (example,) = load_examples(folder)
    assert example.outcome.rebalanced and reward(example) > 0
