"""Event-driven replay: arrivals and departures by time, departures first, optional FIFO retry."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlsched.cli import main as rlsched_main
from rlsched.policy import NodeSpec, PodSpec, TypicalPods, make_scorer
from rlsched.policy.events import run_events

ONE_CARD = [NodeSpec("n", 8000, 8192, 1, "T4")]
TYPICAL = TypicalPods(np.array([0]), np.array([1000]), np.array([1]), ((),), np.array([1.0]))


def whole(name: str, start: float, end: float | None) -> PodSpec:
    return PodSpec(name, 1000, 1024, 1, 1000, (), start, end)


def replay(pods, retry: bool = False, nodes=ONE_CARD):
    return run_events(nodes, pods, make_scorer("bestfit"), 0, TYPICAL, retry_failed=retry)


def test_without_retry_a_pod_that_does_not_fit_fails() -> None:
    # A holds the only card 0..10; B arrives at 5 and fails.
    result = replay([whole("A", 0, 10), whole("B", 5, 20)])
    assert (result.pods, result.placed, result.failed_pods) == (2, 1, 1)
    assert result.timeline == [(0.0, 100.0), (5.0, 100.0), (10.0, 0.0)]
    # allocated 1000 milli over [0, 10], span 10 → 100 %
    assert result.mean_allocated_gpu_pct == pytest.approx(100.0)
    assert result.peak_allocated_gpu_pct == 100.0 and result.mean_wait_seconds == 0.0


def test_retry_places_the_waiting_pod_after_a_departure() -> None:
    result = replay([whole("A", 0, 10), whole("B", 5, 20)], retry=True)
    assert (result.placed, result.failed_pods) == (2, 0)
    # B waits 5..10, is placed when A leaves, leaves at 20.
    assert result.timeline == [(0.0, 100.0), (5.0, 100.0), (10.0, 100.0), (20.0, 0.0)]
    assert result.mean_wait_seconds == pytest.approx((0 + 5) / 2)
    assert result.mean_allocated_gpu_pct == pytest.approx(100.0)


def test_departures_come_first_at_equal_times() -> None:
    # A leaves at 10 exactly when B arrives: B fits without retrying.
    result = replay([whole("A", 0, 10), whole("B", 10, 30)])
    assert (result.placed, result.failed_pods) == (2, 0)
    # allocated: 1000 on [0, 10] and [10, 30] → 100 % over the 30 s span
    assert result.mean_allocated_gpu_pct == pytest.approx(100.0)


def test_time_weighted_mean() -> None:
    # Two cards. A: 0..10 (one card), B: 5..10 (one card). Allocated: 50 % on [0,5], 100 % on [5,10],
    # then C arrives at 20 alone until 40: 0 % on [10,20], 50 % on [20,40]. Mean over 40 s:
    # (50·5 + 100·5 + 0·10 + 50·20) / 40 = 1750 / 40 = 43.75 %
    nodes = [NodeSpec("n", 8000, 8192, 2, "T4")]
    result = replay([whole("A", 0, 10), whole("B", 5, 10), whole("C", 20, 40)], nodes=nodes)
    assert result.mean_allocated_gpu_pct == pytest.approx(43.75)
    assert result.peak_allocated_gpu_pct == 100.0
    assert [t for t, _ in result.timeline] == sorted(t for t, _ in result.timeline)


def test_pod_without_deletion_stays() -> None:
    result = replay([whole("A", 0, None), whole("B", 1, 2)], retry=True)
    assert (result.placed, result.failed_pods) == (1, 1)  # B never gets the card: still waiting at the end


def test_waiting_pod_deleted_before_capacity_frees_is_never_placed() -> None:
    # B waits for A's card, but B is deleted at 8, before A leaves at 10: it must not run (it no longer
    # exists), and the timeline must not step back in time.
    result = replay([whole("A", 0, 10), whole("B", 5, 8)], retry=True)
    times = [t for t, _ in result.timeline]
    assert times == sorted(times)
    assert (result.placed, result.failed_pods) == (1, 1)
    assert result.timeline[-1] == (10.0, 0.0)


def test_needs_creation_times() -> None:
    with pytest.raises(ValueError, match="needs creation_time on every pod; 1 pod"):
        replay([whole("A", 0, 10), PodSpec("B", 1, 1)])


def test_cli_events_mode(capsys, tmp_path: Path) -> None:
    trace = tmp_path / "trace.yaml"
    trace.write_text(
        "nodes:\n  - {name: n, cpu: '8', memory: 8Gi, gpus: 1, gpuModel: T4}\n"
        "pods:\n  - {name: a, cpu: '1', memory: 1Gi, gpus: 1, creationTime: 0, deletionTime: 10}\n"
        "  - {name: b, cpu: '1', memory: 1Gi, gpus: 1, creationTime: 5, deletionTime: 20}\n"
    )
    code = rlsched_main(
        [
            "evaluate",
            "--mode",
            "events",
            "--retry-failed",
            "--nodes",
            str(trace),
            "--pods",
            str(trace),
            "--policy",
            "fgd",
            "--seeds",
            "1",
            "--out",
            str(tmp_path),
            "--no-progress",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = json.loads((tmp_path / "evaluation-events.json").read_text())
    assert len(rows) == 1 and rows[0]["placed"] == 2 and rows[0]["failed_pods"] == 0
    assert "fgd" in out
