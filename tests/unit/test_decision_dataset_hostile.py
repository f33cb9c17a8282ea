"""The decision log as hostile input (policy/decision_dataset.py): it is written for days from what an
extender answered and a pod watch saw, so a crafted or corrupt line, an implausible value or an
unreadable segment is skipped and counted, never a traceback, a refused trace or a silently wrong
workload; ``rlsched train --from-decisions`` fails, in one line, only when nothing usable remains."""

from __future__ import annotations

import json
import os
import sys
import tracemalloc
import types
from pathlib import Path
from typing import Any

import pytest

from rlsched.policy import decision_dataset
from rlsched.policy.decision_dataset import (
    FORMAT,
    ReadStats,
    iter_records,
    load_examples,
    prepare_fine_tune,
    summarize,
    workload,
)
from rlsched.policy.trace import load_pods

HEADER = {"type": "header", "format": FORMAT}
REQUEST = {"cpuMilli": 4000, "memoryMiB": 1024, "numGpu": 1, "gpuMilli": 500}


def decision(seq: int, uid: str | None = None, /, **fields: Any) -> dict[str, Any]:
    """A filter decision as the extender logs it (``fields`` override)."""
    rec: dict[str, Any] = {
        "type": "decision",
        "kind": "filter",
        "epoch": "e",
        "seq": seq,
        "time": 1000.0 + seq,
        "loggedAt": 1000.5 + seq,
        "node": "n1",
        "cards": [0],
        "pod": {"uid": uid or f"uid-{seq}", "namespace": "ns", "name": "job"},
        "features": {"pod": dict(REQUEST)},
        "topScores": [{"node": "n1", "score": 1.0}],
    }
    rec.update(fields)
    return rec


def outcome(uid: str, event: str, **fields: Any) -> dict[str, Any]:
    return {"type": "outcome", "event": event, "pod": {"uid": uid, "namespace": "ns", "name": "job"}, **fields}


GOOD = [decision(0), decision(1)]


def write(folder: Path, lines: list[Any], name: str = "segment-0000000000001-000001.jsonl") -> Path:
    """A segment of ``lines`` (objects as JSON, bytes as they are) after a header."""
    folder.mkdir(parents=True, exist_ok=True)
    data = b"".join((x if isinstance(x, bytes) else json.dumps(x).encode()) + b"\n" for x in [HEADER, *lines])
    (folder / name).write_bytes(data)
    return folder


CRAFTED: dict[str, Any] = {
    "nested thousands deep": b"[" * 100_000 + b"]" * 100_000,
    "cpuMilli 1e400": b'{"type":"decision","kind":"filter","epoch":"e","seq":9,"time":1.0,"node":"n1",'
    b'"pod":{"uid":"u9"},"features":{"pod":{"cpuMilli":1e400,"memoryMiB":1,"numGpu":1,"gpuMilli":500}}}',
    "a time of 400 digits": decision(9, time=10**400),
    "an epoch that is a list": decision(9, epoch=["x"]),
    "a seq that is a mapping": decision(9, seq={"a": 1}),
    "booleans as numbers": decision(9, features={"pod": {**REQUEST, "cpuMilli": True, "numGpu": True}}),
    "numbers as text": decision(9, features={"pod": {**REQUEST, "cpuMilli": "4000"}}),
    "a million GPUs": decision(9, features={"pod": {**REQUEST, "numGpu": 10**6, "gpuMilli": 1000}}),
    "a negative request": decision(9, features={"pod": {**REQUEST, "cpuMilli": -1}}),
    "no time at all": decision(9, time=None, loggedAt=None),
    "a negative lifetime": outcome("uid-1", "ended", how="deleted", time=5.0, lifetimeSeconds=-500.0),
    "a NaN lifetime": b'{"type":"outcome","event":"ended","how":"deleted","pod":{"uid":"uid-1"},"lifetimeSeconds":NaN}',
    "a lifetime of a thousand years": outcome("uid-1", "ended", how="deleted", lifetimeSeconds=3.2e10),
    "a negative pending time": outcome("uid-1", "bound", node="n1", pendingSeconds=-1e9),
    "an infinite pending time": b'{"type":"outcome","event":"bound","node":"n1","pod":{"uid":"uid-1"},'
    b'"pendingSeconds":Infinity}',
}


@pytest.mark.parametrize("line", CRAFTED.values(), ids=CRAFTED.keys())
def test_a_crafted_line_is_skipped_and_counted(tmp_path: Path, line: Any) -> None:
    """Before: a traceback (RecursionError, OverflowError, TypeError), a trace the trainer refuses (a
    pod ending before it starts), or a silently wrong one (``true`` read as 1, a million GPUs, a pod at
    time 0 among pods at 1000 s, a reward of ten million)."""
    write(tmp_path / "log", [*GOOD, line])
    trace, summary = prepare_fine_tune(tmp_path / "log", tmp_path / "out")
    assert summary.stats.bad_lines == 1 and summary.examples == 2
    assert [(p.creation_time, p.deletion_time) for p in load_pods(trace)] == [(0.0, None), (1.0, None)]
    assert summary.mean_reward == 0.0  # nothing bound: no reward from a crafted pending time
    assert "1 bad lines" in summary.lines()[-1]


def test_a_valid_outcome_is_still_joined(tmp_path: Path) -> None:
    """The checks refuse only the implausible: a real binding and end are read."""
    lines = [
        *GOOD,
        outcome("uid-1", "bound", node="n1", pendingSeconds=10.0),
        outcome("uid-1", "ended", how="evicted", lifetimeSeconds=50.0),
    ]
    trace, summary = prepare_fine_tune(write(tmp_path / "log", lines), tmp_path / "out")
    assert summary.stats.bad_lines == 0 and summary.bound == 1 and summary.evicted == 1
    assert [p.deletion_time for p in load_pods(trace)] == [None, 51.0]


def test_a_slightly_negative_duration_from_clock_skew_reads_as_zero(tmp_path: Path) -> None:
    """The operator logs ``lifetimeSeconds = its clock - the API server's creation time``: with its clock
    3 s behind, a pod evicted a second after creation logs -2. The eviction was dropped with the line,
    and the decision rewarded +1 instead of charged."""
    lines = [
        *GOOD,
        outcome("uid-1", "bound", node="n1", pendingSeconds=-1.5),
        outcome("uid-1", "ended", how="evicted", lifetimeSeconds=-2.0),
    ]
    trace, summary = prepare_fine_tune(write(tmp_path / "log", lines), tmp_path / "out")
    assert summary.stats.bad_lines == 0 and summary.bound == 1 and summary.evicted == 1
    assert summary.mean_reward == pytest.approx(1.0 - 5.0)  # placed (+1), then evicted (-5): charged
    # ... and it ends in the trace (a lifetime of 0 read as "none": the pod held its cards for ever)
    assert [p.deletion_time for p in load_pods(trace)] == [None, 1.0]


def test_recreated_pods_whose_uids_share_a_prefix_are_two_pods(tmp_path: Path) -> None:
    """A StatefulSet pod recreated under the same name: its UIDs may share the first 8 digits (the pod
    names were ``name@uid[:8]``, alike, and the trainer refused the whole trace)."""
    uids = ["9f1c2d3e-0a1b-4c2d-8e3f-111111111111", "9f1c2d3e-7777-4abc-9def-222222222222"]
    log = write(tmp_path / "log", [decision(i, uid) for i, uid in enumerate(uids)])
    trace, _ = prepare_fine_tune(log, tmp_path / "out")
    assert [p.name for p in load_pods(trace)] == [f"ns/job@{uid}" for uid in uids]


def test_a_pod_name_taken_by_another_pod_drops_the_second(tmp_path: Path) -> None:
    """Only a crafted log names two pods alike (names end in the UID): the second is counted, not fatal."""
    lines = [
        decision(0, "b@c", pod={"uid": "b@c", "namespace": "ns", "name": "a"}),
        decision(1, "c", pod={"uid": "c", "namespace": "ns", "name": "a@b"}),
    ]
    trace, summary = prepare_fine_tune(write(tmp_path / "log", lines), tmp_path / "out")
    assert len(load_pods(trace)) == 1 and summary.stats.dropped_pods == 1


def test_an_overlong_line_is_skipped_without_being_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: every segment was read whole, and split, into memory (~10 times the log's size)."""
    monkeypatch.setattr(decision_dataset, "MAX_LINE_BYTES", 64 << 10, raising=False)
    huge = decision(5, features={"pod": dict(REQUEST), "pad": "x" * (16 << 20)})
    write(tmp_path, [GOOD[0], huge, GOOD[1]])
    with open(tmp_path / "segment-0000000000001-000001.jsonl", "ab") as f:
        f.write(b'{"type": "decision", "pad": "' + b"y" * (4 << 20))  # an overlong torn tail
    stats = ReadStats()
    tracemalloc.start()
    try:
        examples = load_examples(tmp_path, stats)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [e.pod_uid for e in examples] == ["uid-0", "uid-1"]
    assert stats.bad_lines == 2 and stats.lines == 5
    assert peak < 4 << 20, f"peak {peak:,} bytes: the line was held whole"


def test_an_example_keeps_only_what_the_join_and_trainer_read(tmp_path: Path) -> None:
    """Before: every decision kept its whole record (kube-scheduler's ``kept`` node list included) until
    the join, and its whole ``features`` and ``topScores`` after it."""
    extra = {
        "kept": [f"node-{i}" for i in range(5000)],
        "features": {"pod": dict(REQUEST), "node": {"gpuCount": 8, "load": {"cpu": 0.5}}, "nodes": [{"x": 1}] * 99},
        "topScores": [{"node": f"n{i}", "score": 0.5, "extra": ["x"] * 100} for i in range(100)],
        "shadow": {"node": "n2", "agree": False, "cards": [0, 1], "trace": {"deep": {"deeper": 1}}},
    }
    (ex,) = load_examples(write(tmp_path, [decision(0, **extra)]))
    assert ex.features == {"pod": REQUEST, "node": {"gpuCount": 8, "load": {"cpu": 0.5}}}
    assert len(ex.scores) == decision_dataset.TOP_SCORES and ex.scores[0] == {"node": "n0", "score": 0.5}
    assert ex.shadow == {"node": "n2", "agree": False, "cards": [0, 1], "trace": {}}


def test_summarize_reads_the_log_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the reward weights were a second read of the whole log."""
    write(tmp_path, [*GOOD, {"type": "policy", "rewardWeights": {"placed": 3.0, "evicted": True}}])
    write(tmp_path, [outcome("uid-1", "bound", node="n1", pendingSeconds=0.0)], "segment-0000000000002-000001.jsonl")
    reads: list[Path] = []
    real = decision_dataset.iter_records

    def counted(path: Path, stats: ReadStats | None = None) -> Any:
        reads.append(path)
        return real(path, stats)

    monkeypatch.setattr(decision_dataset, "iter_records", counted)
    _, summary = summarize(tmp_path)
    assert len(reads) == 1
    assert summary.mean_reward == 3.0  # the policy line's weight (and the default for the boolean)
    assert decision_dataset.reward_weights(tmp_path) == {**decision_dataset.REWARD_DEFAULTS, "placed": 3.0}


def test_pods_without_a_usable_request_are_counted(tmp_path: Path) -> None:
    """Before: a pod whose request no trace can hold (a share of a card with two cards, no request
    logged) left the trace without a word."""
    lines = [
        *GOOD,
        decision(2, features={"pod": {**REQUEST, "numGpu": 2}}),
        decision(3, features={}),
        decision(4, "uid-3"),  # a later decision of that pod has a request: it is kept
    ]
    trace, summary = prepare_fine_tune(write(tmp_path / "log", lines), tmp_path / "out")
    assert [p.name for p in load_pods(trace)] == ["ns/job@uid-0", "ns/job@uid-1", "ns/job@uid-3"]
    assert summary.stats.dropped_pods == 1 and summary.stats.bad_lines == 0
    assert "1 pods without a usable request" in summary.lines()[-1]


def test_latency_sensitive_pods_are_counted_as_trained_as_ordinary(tmp_path: Path) -> None:
    """The generic trace format has no QoS class: the summary says so rather than losing the class silently."""
    ls = {"pod": {**REQUEST, "latencySensitive": True}}
    log = write(tmp_path / "log", [decision(0, features=ls), decision(1)])
    stats = ReadStats()
    pods = workload(load_examples(log, stats), stats)
    assert [p.qos for p in pods] == ["LS", ""] and stats.latency_sensitive == 1
    _, summary = prepare_fine_tune(log, tmp_path / "out")
    assert "1 latency-sensitive pods trained as ordinary ones" in summary.lines()[-1]


def test_an_unreadable_segment_is_skipped_and_counted(tmp_path: Path) -> None:
    """Before: one dangling link, symlink loop or folder named like a segment stopped the whole read."""
    write(tmp_path, GOOD)
    os.symlink("/nonexistent", tmp_path / "segment-0000000000002-000001.jsonl")
    os.symlink("segment-0000000000003-000001.jsonl", tmp_path / "segment-0000000000003-000001.jsonl")
    (tmp_path / "segment-0000000000004-000001.jsonl").mkdir()
    write(tmp_path, [decision(5)], "segment-0000000000005-000001.jsonl")
    stats = ReadStats()
    assert [e.pod_uid for e in load_examples(tmp_path, stats)] == ["uid-0", "uid-1", "uid-5"]
    assert (stats.files, stats.unreadable) == (5, 3)
    assert "3 unreadable segments" in stats.describe()


def test_a_segment_failing_mid_read_keeps_what_was_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read error (a volume gone, a file truncated under the reader) ends that segment, not the read."""
    write(tmp_path, GOOD)
    write(tmp_path, [decision(5)], "segment-0000000000005-000001.jsonl")
    real_open = open

    class Failing:
        def __init__(self, f: Any) -> None:
            self.f, self.calls = f, 0

        def __enter__(self) -> Failing:
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()

        def readline(self, size: int = -1) -> bytes:
            self.calls += 1
            if self.calls > 2:
                raise OSError(5, "Input/output error")
            return self.f.readline(size)

    def failing_first(path: Any, mode: str = "r") -> Any:
        f = real_open(path, mode)
        return Failing(f) if str(path).endswith("0001-000001.jsonl") else f

    monkeypatch.setattr(decision_dataset, "open", failing_first, raising=False)
    stats = ReadStats()
    assert [r["pod"]["uid"] for r in iter_records(tmp_path, stats) if r["type"] == "decision"] == ["uid-0", "uid-5"]
    assert stats.unreadable == 1


# -- rlsched train --from-decisions --------------------------------------------------------------------


def train(tmp_path: Path, log: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int | None, dict[str, Any]]:
    """``rlsched train --from-decisions LOG`` with the trainer stubbed: (exit status, what it was given)."""
    from rlsched.cli import main

    seen: dict[str, Any] = {}

    def fake_train(args: Any) -> None:
        seen["pods"] = load_pods(args.traces[0])
        raise SystemExit(0)

    fake = types.ModuleType("fake_trainer")
    fake.train = fake_train  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "rlsched.policy.ppo.trainer", fake)
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps({"nodes": [{"name": "n", "cpu": "32", "memory": "64Gi", "gpus": 8, "gpuModel": "V"}]}))
    argv = ["train", "--from-decisions", str(log), "--nodes", str(nodes), "--out-dir", str(tmp_path / "out")]
    try:
        code = main([*argv, "--method", "ppo"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else None
    return code, seen


def test_train_from_a_hostile_log_trains_on_what_is_usable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a traceback for the first crafted line."""
    log = write(tmp_path / "log", [*GOOD, *CRAFTED.values()])
    os.symlink("/nonexistent", log / "segment-0000000000002-000001.jsonl")
    code, seen = train(tmp_path, log, monkeypatch)
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err, err
    assert len(seen["pods"]) == 2
    assert f"skipped 1 unreadable segments, 0 torn tails, {len(CRAFTED)} bad lines" in err


def test_train_from_a_log_with_nothing_usable_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 and one line saying what was skipped, only when no pod is left."""
    log = write(tmp_path / "log", list(CRAFTED.values()))
    code, seen = train(tmp_path, log, monkeypatch)
    err = capsys.readouterr().err
    assert code == 2 and not seen
    assert err.startswith("rlsched train: --from-decisions: ") and err.count("\n") == 1, err
    assert "0 pods with a readable request" in err and f"{len(CRAFTED)} bad lines" in err
