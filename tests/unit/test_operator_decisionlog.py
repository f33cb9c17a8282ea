"""The decision log: rotation, size bound, crash safety, the drainer, outcomes, and the reader."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import pytest

from rlsched.extender.decision_ring import DecisionRing
from rlsched.operator import decisionlog
from rlsched.operator.decisionlog import DecisionLog, Drainer, OutcomeTracker, ended_how
from rlsched.operator.extender_client import ExtenderUnavailable
from rlsched.policy.decision_dataset import (
    FORMAT,
    ReadStats,
    iter_records,
    load_examples,
    reward,
    reward_weights,
    summarize,
    workload,
)


def filter_record(uid: str, node: str | None = "n1", verdict: str | None = None, version: str = "v1") -> dict:
    rec = {
        "kind": "filter",
        "pod": {"uid": uid, "namespace": "ns", "name": f"p-{uid}"},
        "node": node,
        "cards": [0] if node else [],
        "servedBy": "policy",
        "scorer": "test:v1",
        "modelVersion": version,
        "mode": "active",
        "topScores": [{"node": node, "score": 1.0}] if node else [],
        "features": {"pod": {"cpuMilli": 4000, "memoryMiB": 8192, "numGpu": 1, "gpuMilli": 500, "constrained": False}},
    }
    if verdict:
        rec.update(verdict=verdict, reason="busy", retryAfterSeconds=5.0)
    return rec


class RingClient:
    """/decisions over a real DecisionRing."""

    def __init__(self, size: int = 100) -> None:
        self.ring = DecisionRing(size)
        self.up = True

    async def decisions(self, after: int, limit: int = 1000) -> dict:
        if not self.up:
            raise ExtenderUnavailable("down")
        return json.loads(json.dumps(self.ring.read(after, limit)))


def test_rotation_bound_and_headers(tmp_path: Path) -> None:
    log = DecisionLog(
        tmp_path, segment_bytes=4096, max_bytes=3 * 4096, header=lambda: {"rewardWeights": {"placed": 2.0}}
    )
    for i in range(200):
        log.append([{"type": "decision", "kind": "filter", "seq": i, "pad": "x" * 100}])
    segs = sorted(tmp_path.glob("segment-*.jsonl"))
    assert len(segs) >= 2 and log.segments_deleted > 0
    assert log.total_bytes() <= 3 * 4096 + 4096  # the bound, give or take the open segment
    for s in segs:
        first = json.loads(s.read_text().splitlines()[0])
        assert first["type"] == "header" and first["format"] == FORMAT
    assert reward_weights(tmp_path)["placed"] == 2.0
    log.close()


def test_torn_tail_is_skipped_on_read_and_cut_on_reopen(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path, segment_bytes=1 << 20, max_bytes=4 << 20)
    log.append([{"type": "decision", "kind": "filter", "seq": 1, "pod": {"uid": "a"}, "node": "n"}])
    log.close()
    seg = next(tmp_path.glob("segment-*.jsonl"))
    with open(seg, "ab") as f:
        f.write(b'{"type": "decision", "kind": "filter", "seq": 2, "po')  # the process died mid-write
    stats = ReadStats()
    assert [r.get("seq") for r in iter_records(tmp_path, stats) if r["type"] == "decision"] == [1]
    assert stats.torn_tails == 1
    log2 = DecisionLog(tmp_path, segment_bytes=1 << 20, max_bytes=4 << 20)
    log2.open()
    log2.append([{"type": "decision", "kind": "filter", "seq": 3, "pod": {"uid": "b"}, "node": "n"}])
    log2.close()
    stats = ReadStats()
    assert [r.get("seq") for r in iter_records(tmp_path, stats) if r["type"] == "decision"] == [1, 3]
    assert stats.torn_tails == 0 and stats.bad_lines == 0


async def test_drainer_logs_dispatches_and_survives_restarts(tmp_path: Path) -> None:
    client = RingClient(size=5)
    log = DecisionLog(tmp_path / "log", segment_bytes=1 << 20, max_bytes=4 << 20)
    seen: list[dict] = []
    d = Drainer(client, log, [seen.append])
    client.ring.append(filter_record("a"))
    client.ring.append(filter_record("b", node=None, verdict="delay"))
    assert await d.drain_once() == 2 and [r["pod"]["uid"] for r in seen] == ["b"]
    for i in range(8):  # more than the ring holds: 3 are dropped before the next drain
        client.ring.append(filter_record(f"c{i}"))
    assert await d.drain_once() == 5
    gaps = [r for r in iter_records(tmp_path / "log") if r["type"] == "gap"]
    assert gaps and gaps[0]["dropped"] == 3
    # A new operator process continues from the persisted cursor: nothing twice.
    d2 = Drainer(client, log, [])
    client.ring.append(filter_record("d"))
    assert await d2.drain_once() == 1
    # The extender restarts (new epoch): read its ring from the start.
    client.ring = DecisionRing(5, clock=lambda: 12345.0)
    client.ring.append(filter_record("e"))
    assert await d2.drain_once() == 1
    uids = [r["pod"]["uid"] for r in iter_records(tmp_path / "log") if r["type"] == "decision"]
    assert uids == ["a", "b", *[f"c{i}" for i in range(3, 8)], "d", "e"]
    client.up = False
    with pytest.raises(ExtenderUnavailable):
        await d2.drain_once()
    log.close()


async def test_two_extenders_behind_one_service_dispatch_a_verdict_once() -> None:
    """With two scheduler replicas the Service answers /decisions from either extender. Only the last
    ring's dispatched position was kept, so every switch back to the ring holding a delay verdict
    called the listeners for it again: a requeue and an event per switch, for one verdict."""
    leader, follower = RingClient(), RingClient()
    follower.ring = DecisionRing(100, clock=lambda: 54321.0)  # another epoch
    leader.ring.append(filter_record("b", node=None, verdict="delay"))
    seen: list[dict] = []

    class EitherReplica:  # the leader, then the follower twice (its ring read from the start), in turn
        def __init__(self) -> None:
            self.turns = itertools.cycle([leader, follower, follower])

        async def decisions(self, after: int, limit: int = 1000) -> dict:
            return await next(self.turns).decisions(after, limit)

    d = Drainer(EitherReplica(), None, [seen.append])
    for _ in range(10):
        await d.drain_once()
    assert [r["pod"]["uid"] for r in seen] == ["b"]


class AnswerClient:
    """/decisions answering the given bodies in turn (the last one again), or raising when a body is an exception."""

    def __init__(self, *bodies: object) -> None:
        self.bodies, self.calls = list(bodies), 0

    async def decisions(self, after: int, limit: int = 1000) -> dict:
        body = self.bodies[min(self.calls, len(self.bodies) - 1)]
        self.calls += 1
        if isinstance(body, Exception):
            raise body
        assert isinstance(body, dict)
        return body


def answer(records: list, next_: object = None, last: object = None, dropped: object = 0) -> dict:
    n = len(records)
    return {"epoch": "1", "next": n if next_ is None else next_, "last": n if last is None else last,
            "dropped": dropped, "records": records}  # fmt: skip


async def test_drainer_skips_records_that_are_not_objects(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    delayed = {**filter_record("b", node=None, verdict="delay"), "seq": 5}
    client = AnswerClient(
        answer([1, ["x"], {**filter_record("a"), "seq": 3}, "s", None, delayed]),
        answer([2.5, True], next_=8, last=8),
    )
    log = DecisionLog(tmp_path / "log", segment_bytes=1 << 20, max_bytes=4 << 20)
    seen: list[dict] = []
    d = Drainer(client, log, [seen.append])
    assert await d.drain_once() == 2 and d.skipped == 4 and d.next == 6
    assert [r["pod"]["uid"] for r in seen] == ["b"]
    assert await d.drain_once() == 0 and d.skipped == 6 and d.next == 8
    assert [r["seq"] for r in iter_records(tmp_path / "log") if r["type"] == "decision"] == [3, 5]
    assert log.load_cursor() == {"epoch": "1", "next": 8}  # the cursor moved past them: not read again
    assert len([r for r in caplog.records if "not JSON objects" in r.getMessage()]) == 1  # once, not per poll
    log.close()


async def test_a_record_json_cannot_write_is_skipped_not_retried_forever(tmp_path: Path) -> None:
    """The extender client parses with Python's json, which reads NaN and 1e400; the log writes strict
    JSON. One such record made the whole batch fail, before the cursor moved, on every poll."""
    raw = json.loads(
        '{"epoch": "1", "next": 3, "last": 3, "dropped": 0, "records": ['
        '{"seq": 1, "verdict": "delay", "pod": {"uid": "u1"}}, {"seq": 2, "score": NaN}, '
        '{"seq": 3, "verdict": "delay", "pod": {"uid": "u3"}, "retryAfterSeconds": 1e400}]}'
    )
    log = DecisionLog(tmp_path / "log", segment_bytes=1 << 20, max_bytes=4 << 20)
    seen: list[dict] = []
    d = Drainer(AnswerClient(raw, answer([], next_=3, last=3)), log, [seen.append])
    assert await d.drain_once() == 1 and d.skipped == 2 and d.next == 3
    assert [r["pod"]["uid"] for r in seen] == ["u1"]
    assert [r["seq"] for r in iter_records(tmp_path / "log") if r["type"] == "decision"] == [1]
    log.close()


async def test_an_answer_whose_cursor_does_not_move_is_not_logged_again_and_again(tmp_path: Path) -> None:
    """An answer that keeps repeating the same records with the same ``next``, while ``last`` says there
    is more: written 100 times in one drain, and again on every poll."""
    log = DecisionLog(tmp_path / "log", segment_bytes=1 << 20, max_bytes=4 << 20)
    seen: list[dict] = []
    stuck = answer([{**filter_record("a", node=None, verdict="delay"), "seq": 1}], next_=1, last=5)
    d = Drainer(AnswerClient(stuck), log, [seen.append])
    assert await d.drain_once() == 1 and await d.drain_once() == 0
    assert log.lines_written == 1 and len(seen) == 1 and d.next == 1
    log.close()


@pytest.mark.parametrize(
    "body",
    [
        answer([filter_record("a")], next_="soon"),
        answer([filter_record("a")], next_=-3),
        answer([filter_record("a")], next_=[1]),
        answer([filter_record("a")], last={"n": 1}),
        answer([filter_record("a")], dropped="many"),
        answer([filter_record("a")], dropped=True),
        answer([], dropped=1.5),
    ],
    ids=["next-word", "next-negative", "next-list", "last-object", "dropped-word", "dropped-bool", "dropped-float"],
)
async def test_drainer_treats_a_bad_count_as_unavailable(tmp_path: Path, body: dict) -> None:
    log = DecisionLog(tmp_path / "log", segment_bytes=1 << 20, max_bytes=4 << 20)
    seen: list[dict] = []
    d = Drainer(AnswerClient(body), log, [seen.append])
    with pytest.raises(ExtenderUnavailable, match="GET /decisions: .* (not a count|negative)"):
        await d.drain_once()
    # Nothing of the answer was logged, dispatched or acknowledged.
    assert d.bad_answers == 1 and d.next == 0 and d.drained == 0 and d.dropped == 0 and not seen
    assert log.lines_written == 0 and log.load_cursor() == {}
    log.close()


@pytest.mark.parametrize(
    "body",
    [
        answer([1]),
        answer([["x"]]),
        answer([{"seq": 1}], next_="soon"),
        answer([], dropped="many"),
        RuntimeError("a bug in a poll"),
    ],
    ids=["record-number", "record-list", "next-word", "dropped-word", "any-error"],
)
async def test_drainer_task_survives_a_bad_poll(body: object, caplog: pytest.LogCaptureFixture) -> None:
    """/tmp/review/drainer_dies.py: one bad answer ended run() (an unsupervised task) for good."""
    client = AnswerClient(body, body, body, answer([{**filter_record("z"), "seq": 9}], next_=9, last=9))
    d = Drainer(client, None, interval_s=0.001)
    task = asyncio.create_task(d.run())
    for _ in range(500):
        if client.calls >= 5 or task.done():
            break
        await asyncio.sleep(0.002)
    assert not task.done(), task.exception()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert client.calls >= 5 and d.drained >= 1 and d.last_error is None  # it recovered once the answer did
    if isinstance(body, RuntimeError):  # logged once with its traceback, not once per poll
        failures = [r for r in caplog.records if "draining decisions failed" in r.getMessage()]
        assert len(failures) == 1 and failures[0].exc_info is not None


def pod(
    uid: str,
    node: str = "",
    phase: str = "Pending",
    created: str = "2026-01-01T00:00:00Z",
    scheduled_at: str | None = None,
    disruption: str | None = None,
) -> dict:
    conds = []
    if scheduled_at:
        conds.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled_at})
    if disruption:
        conds.append({"type": "DisruptionTarget", "status": "True", "reason": disruption})
    return {
        "metadata": {"uid": uid, "namespace": "ns", "name": f"p-{uid}", "creationTimestamp": created},
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase, "conditions": conds},
    }


async def test_outcomes_and_the_joined_examples(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path, segment_bytes=1 << 20, max_bytes=4 << 20, header=lambda: {"rewardWeights": None})
    t = {"now": 1767225660.0}  # 2026-01-01T00:01:00Z
    tracker = OutcomeTracker(log.awrite, clock=lambda: t["now"])
    log.append(
        [
            {
                "type": "decision",
                "epoch": "1",
                "seq": 1,
                "time": 1767225601.0,
                **filter_record("a", node=None, verdict="delay"),
            },
            {"type": "decision", "epoch": "1", "seq": 2, "time": 1767225630.0, **filter_record("a", node="n1")},
            {
                "type": "decision",
                "epoch": "1",
                "seq": 2,
                "time": 1767225630.0,
                **filter_record("a", node="n1"),
            },  # logged twice
            {"type": "decision", "epoch": "1", "seq": 3, "time": 1767225640.0, **filter_record("b", node="n2")},
        ]
    )
    await tracker.observe("MODIFIED", pod("a", "n1", "Running", scheduled_at="2026-01-01T00:00:40Z"))
    await tracker.observe(
        "MODIFIED", pod("a", "n1", "Running", scheduled_at="2026-01-01T00:00:40Z")
    )  # no second "bound"
    await tracker.observe("MODIFIED", pod("b", "n3", "Running", scheduled_at="2026-01-01T00:00:50Z"))
    t["now"] += 100
    await tracker.observe(
        "MODIFIED", pod("b", "n3", "Running", scheduled_at="2026-01-01T00:00:50Z", disruption="EvictionByEvictionAPI")
    )
    await tracker.observe("DELETED", pod("b", "n3", "Running", disruption="EvictionByEvictionAPI"))
    log.close()
    outcomes = [r for r in iter_records(tmp_path) if r["type"] == "outcome"]
    assert [(o["pod"]["uid"], o["event"]) for o in outcomes] == [("a", "bound"), ("b", "bound"), ("b", "ended")]
    assert outcomes[0]["pendingSeconds"] == 40.0 and outcomes[2]["how"] == "evicted"

    examples = load_examples(tmp_path)
    assert [(e.pod_uid, e.action) for e in examples] == [("a", "delay"), ("a", "place"), ("b", "place")]
    delay, placed, evicted = examples
    assert placed.followed and placed.outcome.pending_seconds == 40.0
    assert evicted.followed is False and evicted.outcome.ended == "evicted"
    w = {"placed": 1.0, "pendingSeconds": 0.01, "evicted": 5.0, "nodeLoad": 0.5}
    assert reward(placed, w) == pytest.approx(1.0 - 0.4)
    assert reward(evicted, w) == pytest.approx(-0.5 - 5.0)
    assert reward(delay, w) == pytest.approx(-0.01 * 40.0)  # the delay's pod was bound 40 s after creation
    pods = workload(examples)
    assert [p.name for p in pods] == ["ns/p-a@a", "ns/p-b@b"] and pods[0].gpu_milli == 500
    _, summary = summarize(tmp_path)
    assert (summary.examples, summary.placements, summary.delays, summary.bound, summary.followed, summary.evicted) == (
        3,
        2,
        1,
        2,
        1,
        1,
    )
    assert "model versions: v1 (3)" in "\n".join(summary.lines())


def test_ended_how() -> None:
    assert ended_how(pod("x", "n", disruption="PreemptionByScheduler"), False) == "preempted"
    assert ended_how(pod("x", "n", phase="Succeeded"), False) == "succeeded"
    assert ended_how(pod("x", "n", phase="Running"), True) == "deleted"
    assert ended_how(pod("x", "n", phase="Running"), False) is None


@pytest.mark.parametrize("cursor", ['{"epoch": "1", "next": "soon"}', '{"epoch": 7, "next": -3}', '{"next": [1]}'])
def test_a_cursor_edited_by_hand_restarts_from_the_ring_start(tmp_path: Path, cursor: str) -> None:
    (tmp_path / "cursor.json").write_text(cursor)
    drainer = Drainer(AnswerClient(answer([])), DecisionLog(tmp_path))
    assert drainer.next == 0 and drainer.epoch is None
    (tmp_path / "cursor.json").write_text('{"epoch": "1", "next": 42}')
    drainer = Drainer(AnswerClient(answer([])), DecisionLog(tmp_path))
    assert drainer.next == 42 and drainer.epoch == "1"


async def test_load_probe_reads_a_bounded_answer() -> None:
    """One node's load from Prometheus: a normal answer gives its value; one far larger than a single
    series, or malformed, leaves that column out (nothing raised, the rest read)."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from rlsched.operator.decisionlog import LOAD_ANSWER_BYTES, LoadProbe

    answers = {
        "cpu": {"status": "success", "data": {"result": [{"metric": {}, "value": [0, "0.25"]}]}},
        "memory": {"status": "success", "data": {"result": [{"metric": {"x": "y" * 1000}, "value": [0, "1"]}] * 2000}},
        "network": "[" * 100_000 + "]" * 100_000,
        "gpu": {"status": "success", "data": {"result": [{"metric": {}, "value": [0, "NaN"]}]}},
    }

    async def query(request: web.Request) -> web.Response:
        answer = answers[request.query["query"].split("{")[0]]
        return web.Response(text=answer if isinstance(answer, str) else json.dumps(answer))

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    async with TestServer(app) as server:
        probe = LoadProbe(str(server.make_url("")), {c: c + "{NODE_SELECTOR}" for c in answers})
        assert len(json.dumps(answers["memory"])) > LOAD_ANSWER_BYTES
        assert await probe.sample("n1") == {"cpu": 0.25}


@pytest.mark.parametrize(
    "bad",
    [
        {"cards": ["0x1"]},
        {"time": "2026-01-01T00:00:00Z"},
        {"pod": "ns/b"},
        {"pod": {"uid": ["b"], "namespace": "ns", "name": "b"}},
        {"node": 7},
        {"features": ["x"]},
        {"cards": [True]},
    ],
)
def test_a_badly_typed_record_is_skipped_and_counted_not_fatal(tmp_path: Path, bad: dict) -> None:
    log = DecisionLog(tmp_path, segment_bytes=1 << 20, max_bytes=4 << 20)
    good = {"type": "decision", "epoch": "1", "seq": 1, "time": 1767225601.0, **filter_record("a", node="n1")}
    worse = {"type": "decision", "epoch": "1", "seq": 2, "time": 1767225602.0, **filter_record("b", node="n2")}
    log.append([good, worse | bad])
    log.close()
    stats = ReadStats()
    assert [e.pod_uid for e in load_examples(tmp_path, stats)] == ["a"]
    assert stats.bad_lines == 1
    _, summary = summarize(tmp_path)
    assert summary.examples == 1


async def test_verdicts_reach_the_requeue_when_the_log_cannot_be_written_and_only_once(tmp_path: Path) -> None:
    class FullLog(DecisionLog):
        full = True

        def append_lines(self, lines: Sequence[bytes]) -> int:
            if self.full:
                raise OSError(28, "No space left on device")
            return super().append_lines(lines)

    client = RingClient()
    log = FullLog(tmp_path / "log", segment_bytes=1 << 20, max_bytes=4 << 20)
    seen: list[dict] = []
    d = Drainer(client, log, [seen.append])
    client.ring.append(filter_record("a", node=None, verdict="delay"))
    with pytest.raises(OSError):
        await d.drain_once()
    assert [r["pod"]["uid"] for r in seen] == ["a"] and d.next == 0  # dispatched; the cursor waits
    client.ring.append(filter_record("b", node=None, verdict="reject"))
    with pytest.raises(OSError):
        await d.drain_once()
    assert [r["pod"]["uid"] for r in seen] == ["a", "b"]
    log.full = False
    assert await d.drain_once() == 2
    assert [r["pod"]["uid"] for r in seen] == ["a", "b"] and d.next == 2
    assert [r["pod"]["uid"] for r in iter_records(tmp_path / "log") if r["type"] == "decision"] == ["a", "b"]
    log.close()


async def test_a_load_outcome_that_cannot_be_written_is_counted_not_lost_in_a_task() -> None:

    class Probe:
        async def sample(self, node: str) -> dict:
            return {"cpu": 0.5}

    async def broken(lines: list) -> None:
        raise OSError(28, "No space left on device")

    tracker = OutcomeTracker(broken, cast("Any", Probe()), load_delay_s=0.0)
    await tracker._probe_later({"uid": "a"}, "n1")
    assert tracker.probe_failures == 1


async def test_the_drainer_writes_nothing_on_the_event_loop_and_an_unmoved_cursor_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cursor.json`` was written and fsync'd on kopf's event loop
    on every poll, empty ones too (every 2 s; 200 ms each on a slow volume), and each page of records
    was serialized there to check that JSON could write it."""
    loop_thread = threading.get_ident()
    work: list[tuple[str, bool]] = []  # (what, on the event loop)
    real_fsync, real_dumps = os.fsync, decisionlog._dumps

    def fsync(fd: int) -> None:
        work.append(("fsync", threading.get_ident() == loop_thread))
        real_fsync(fd)

    def dumps(obj: Any) -> bytes:
        work.append(("dumps", threading.get_ident() == loop_thread))
        return real_dumps(obj)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(decisionlog, "_dumps", dumps)
    client = RingClient(size=3)
    log = DecisionLog(tmp_path / "log", segment_bytes=1 << 20, max_bytes=4 << 20)
    saved: list[dict] = []
    real_save = log.save_cursor

    def save_cursor(cursor: dict) -> None:
        saved.append(dict(cursor))
        real_save(cursor)

    monkeypatch.setattr(log, "save_cursor", save_cursor)
    d = Drainer(client, log, [])
    for i in range(5):  # more than the ring holds: a gap line too
        client.ring.append(filter_record(f"a{i}"))
    assert await d.drain_once() == 3
    for _ in range(3):  # nothing new
        assert await d.drain_once() == 0
    assert {what for what, _ in work} == {"fsync", "dumps"}
    assert not [what for what, on_loop in work if on_loop]
    assert [c["next"] for c in saved] == [5]  # once, when it moved
    assert log.load_cursor() == {"epoch": d.epoch, "next": 5}
    assert [r["type"] for r in iter_records(tmp_path / "log")] == ["header", "gap", "decision", "decision", "decision"]
    log.close()


async def test_lines_written_but_a_cursor_not_saved_are_not_written_again(tmp_path: Path) -> None:
    class NoCursor(DecisionLog):
        broken = True

        def save_cursor(self, cursor: Mapping[str, Any]) -> None:
            if self.broken:
                raise PermissionError(13, "Permission denied")
            super().save_cursor(cursor)

    client = RingClient()
    log = NoCursor(tmp_path / "log", segment_bytes=1 << 20, max_bytes=4 << 20)
    d = Drainer(client, log, [])
    client.ring.append(filter_record("a"))
    with pytest.raises(OSError, match="Permission denied"):
        await d.drain_once()
    assert d.next == 1 and log.lines_written == 1
    with pytest.raises(OSError, match="Permission denied"):
        await d.drain_once()
    assert log.lines_written == 1 and log.load_cursor() == {}  # not logged twice; the cursor file waits
    log.broken = False
    await d.drain_once()
    assert log.lines_written == 1 and log.load_cursor() == {"epoch": d.epoch, "next": 1}
    log.close()


async def test_a_pod_bound_long_ago_gets_no_bound_outcome_from_a_later_event() -> None:
    """After a restart the initial listing rightly skipped a pod bound
    hours ago, but its next MODIFIED event logged a fresh ``bound`` (time: now) and probed the node's
    load hours late."""
    lines: list[dict] = []
    probes: list[str] = []

    async def write(batch: list) -> None:
        lines.extend(batch)

    class Probe:
        async def sample(self, node: str) -> dict:
            probes.append(node)
            return {"cpu": 0.5}

    now = 1767232800.0  # 2026-01-01T02:00:00Z
    tracker = OutcomeTracker(write, cast("Any", Probe()), load_delay_s=0.0, clock=lambda: now)
    old = pod("a", "n1", "Running", created="2026-01-01T00:00:00Z", scheduled_at="2026-01-01T00:00:05Z")
    await tracker.observe(None, old)  # the initial listing after a restart
    await tracker.observe("MODIFIED", old)  # a readiness flip, say
    await tracker.observe("ADDED", old)  # a watch that re-lists
    fresh = pod("b", "n2", "Running", created="2026-01-01T01:59:00Z", scheduled_at="2026-01-01T01:59:30Z")
    await tracker.observe("MODIFIED", fresh)
    await tracker.observe("MODIFIED", fresh)  # once
    untimed = pod("c", "n3", "Running")  # no PodScheduled time: a watch event still counts
    await tracker.observe("MODIFIED", untimed)
    await asyncio.sleep(0.01)
    assert [(line["pod"]["uid"], line["event"]) for line in lines if line["event"] == "bound"] == [
        ("b", "bound"),
        ("c", "bound"),
    ]
    assert sorted(probes) == ["n2", "n3"]
    await tracker.close()


async def test_outcomes_that_cannot_be_written_are_logged_once_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    state = {"full": True}
    written: list[dict] = []

    async def write(batch: list) -> None:
        if state["full"]:
            raise OSError(28, "No space left on device")
        written.extend(batch)

    tracker = OutcomeTracker(write)
    with caplog.at_level(logging.INFO, logger="rlsched.operator.decisions"):
        for i in range(20):
            await tracker.observe("ADDED", pod(f"u{i}", "n1", "Running"))
        state["full"] = False
        await tracker.observe("ADDED", pod("ok", "n1", "Running"))
        state["full"] = True
        await tracker.observe("ADDED", pod("again", "n1", "Running"))
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 2 and all("No space left on device" in e for e in errors)  # once per outage
    assert any("written to the decision log again" in r.getMessage() for r in caplog.records)
    assert tracker.write_failed == 21 and [line["pod"]["uid"] for line in written] == ["ok"]


async def test_a_drainer_that_cannot_write_logs_once_and_counts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The drain task logged an ERROR every drainIntervalS."""

    class FullLog(DecisionLog):
        full = True
        refused = 0

        def append_lines(self, lines: Sequence[bytes]) -> int:
            if self.full:
                self.refused += 1
                raise OSError(28, "No space left on device")
            return super().append_lines(lines)

        def append(self, records: Iterable[Mapping[str, Any]]) -> int:  # the drainer before append_lines
            if self.full:
                self.refused += 1
                raise OSError(28, "No space left on device")
            return super().append(records)

    client = RingClient()
    client.ring.append(filter_record("a"))
    log = FullLog(tmp_path / "log", segment_bytes=1 << 20, max_bytes=4 << 20)
    d = Drainer(client, log, [], interval_s=0.001)
    with caplog.at_level(logging.INFO, logger="rlsched.operator.decisions"):
        task = asyncio.create_task(d.run())
        for _ in range(500):
            if log.refused >= 10:
                break
            await asyncio.sleep(0.002)
        log.full = False
        for _ in range(500):
            if d.next == 1:
                break
            await asyncio.sleep(0.002)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert log.refused >= 10 and len(errors) == 1 and "No space left" in errors[0].getMessage()
    assert d.write_failed == log.refused
    assert d.next == 1 and any("written again" in r.getMessage() for r in caplog.records)
    log.close()
