"""Requeue of delayed pods (backoff, cap, give-up, dropped pods) and notices for rejected pods."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from rlsched.operator import requeue
from rlsched.operator.kube import KubeError
from rlsched.operator.requeue import MAX_TRANSIENT_RETRIES, PendingPod, Rejections, Requeuer, pending_pod
from rlsched.operator.settings import RequeueSettings
from rlsched.operator.testing import FakeKube

ANN = "rlsched.io/requeue-attempt"


def pod_body(uid: str = "u1", node: str = "", attempt: str | None = None, message: str | None = None) -> dict:
    body = {
        "metadata": {"uid": uid, "namespace": "ns", "name": f"pod-{uid}", "annotations": {}},
        "spec": {"schedulerName": "rl-scheduler", **({"nodeName": node} if node else {})},
        "status": {"phase": "Pending"},
    }
    if attempt is not None:
        body["metadata"]["annotations"][ANN] = attempt
    if message is not None:
        body["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
        ]
    return body


def test_pending_pod_reads_the_extenders_reasons() -> None:
    msg = (
        "0/4 nodes are available: 4 delayed by policy rl-scheduler until 2026-11-26T14:03:05Z (retry in 30s): "
        "cluster is busy. preemption: ..."
    )
    p = pending_pod(pod_body(attempt="2", message=msg), ANN)
    assert p == PendingPod("u1", "ns", "pod-u1", 2, True, 30.0, None, delayed_until=1_795_701_786.0)
    old = "0/4 nodes are available: 4 delayed by policy rl-scheduler (retry in 30s): cluster is busy."
    assert pending_pod(pod_body(message=old), ANN).retry_after_s == 30.0  # an extender before "until"
    r = pending_pod(pod_body(message="0/4 nodes are available: 4 rejected by policy rl-scheduler: too big."), ANN)
    assert r.rejected == "too big" and not r.delayed
    r = pending_pod(
        pod_body(
            message="0/4 nodes are available: 4 rejected by policy rl-scheduler: asks 2.5 GPUs (max 2). "
            "preemption: 0/4 nodes are available: 4 Preemption is not helpful for scheduling."
        ),
        ANN,
    )
    assert r.rejected == "asks 2.5 GPUs (max 2)"
    assert pending_pod(pod_body(node="n1"), ANN) is None
    assert pending_pod(pod_body(attempt="junk"), ANN).attempt == 0


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("0/4 nodes are available: 3 rejected by policy rl.scheduler: needs 9 GPUs. preemption: x", "needs 9 GPUs"),
        ("0/4 nodes are available: 3 rejected by policy rl-scheduler: needs 9 GPUs. preemption: x", "needs 9 GPUs"),
        ("0/4 nodes are available: 3 rejected by policy a.b.c. preemption: 0/4 nodes", "rejected by policy"),
        ("0/4 nodes are available: 3 rejected by policy rl-scheduler", "rejected by policy"),
    ],
)
def test_the_rejection_reason_follows_a_scheduler_name_with_dots(message: str, reason: str) -> None:
    assert pending_pod(pod_body(message=message), ANN).rejected == reason


def test_a_pod_whose_rejection_was_told_says_so() -> None:
    body = pod_body(message="0/4 nodes are available: 4 rejected by policy rl-scheduler: too big.")
    assert not pending_pod(body, ANN).rejection_noted
    body["metadata"]["annotations"][Rejections.ANNOTATION] = "the scheduling policy rejected this pod: too big"
    assert pending_pod(body, ANN).rejection_noted


async def test_a_delay_of_a_pod_that_is_not_pending_is_not_announced() -> None:
    h = Harness()
    h.r.on_verdict(h.record("bound-or-gone"))  # read again from the ring after a restart, say
    await asyncio.sleep(0)
    assert h.r.scheduled == 0 and h.kube.events == []


async def test_rejections_pass_over_pods_that_are_not_pending_or_were_told() -> None:
    kube = FakeKube()
    index = {
        "u1": PendingPod("u1", "ns", "p1", 0, False, None, "too big"),
        "u2": PendingPod("u2", "ns", "p2", 0, False, None, "too big", rejection_noted=True),
    }
    for uid, name in (("u1", "p1"), ("u2", "p2"), ("u3", "p3")):
        kube.add_pod("ns", name, uid)
    rej = Rejections(kube.patch_pod_annotations, kube.post_event, lookup=index.get)
    for uid, name in (("u1", "p1"), ("u2", "p2"), ("u3", "p3")):
        rej.on_verdict({"verdict": "reject", "reason": "too big", "pod": {"uid": uid, "namespace": "ns", "name": name}})
    await asyncio.sleep(0.01)
    assert [e["ref"]["name"] for e in kube.events] == ["p1"]
    await rej.close()


class Harness:
    def __init__(self, **kw) -> None:
        self.kube = FakeKube()
        self.now = 0.0
        self.index: dict[str, PendingPod] = {}
        self.settings = RequeueSettings(**{"initial_s": 5.0, "max_s": 20.0, "max_attempts": 3, **kw})
        self.r = Requeuer(
            self.settings,
            self.index.get,
            lambda: list(self.index.values()),
            self.kube.patch_pod_annotations,
            self.kube.post_event,
            clock=lambda: self.now,
            wall=lambda: 1_795_000_000.0 + self.now,  # 2026-11-18T11:06:40Z at now = 0
        )

    def add(self, uid: str, attempt: int = 0, delayed: bool = False, namespace: str = "ns") -> None:
        self.kube.add_pod(namespace, f"pod-{uid}", uid, {ANN: str(attempt)} if attempt else {})
        self.index[uid] = PendingPod(uid, namespace, f"pod-{uid}", attempt, delayed, None, None)

    def record(self, uid: str, retry: float | None = 1.0) -> dict:
        namespace = self.index[uid].namespace if uid in self.index else "ns"
        return {
            "kind": "filter",
            "verdict": "delay",
            "retryAfterSeconds": retry,
            "pod": {"uid": uid, "namespace": namespace, "name": f"pod-{uid}"},
        }

    def patched(self) -> list:
        return [c[3] for c in self.kube.calls if c[0] == "patch_pod"]


def test_backoff_doubles_to_the_cap_and_respects_retry_after() -> None:
    h = Harness()
    assert [h.r.backoff(n) for n in range(4)] == [5.0, 10.0, 20.0, 20.0]
    assert h.r.backoff(0, retry_after_s=30.0) == 30.0


async def test_requeue_after_backoff_bumps_the_annotation() -> None:
    h = Harness()
    h.add("u1", attempt=1)
    h.r.on_verdict(h.record("u1"))
    h.r.on_verdict(h.record("u1"))  # the same delay twice: scheduled once
    assert h.r.scheduled == 1
    h.now = 9.9
    assert await h.r.process_due() == 0
    h.now = 10.0
    assert await h.r.process_due() == 1
    assert h.patched() == [{ANN: "2"}] and h.r.requeued == 1


@pytest.mark.parametrize(
    ("verdict_at", "due"),
    [(-600.0, 5.0), (-20.0, 40.0), (0.0, 60.0), (+600.0, 60.0)],
    ids=["read-10-min-late", "read-20-s-late", "read-at-once", "extender-clock-ahead"],
)
async def test_a_delay_read_late_requeues_when_its_hold_ends(verdict_at: float, due: float) -> None:
    """The record dates the verdict; one read late (the operator was down, or slow to drain) counted
    the whole hold again from the reading: a 60 s hold read 10 minutes late was requeued 11 minutes
    after the verdict. What is left of it, never more than the hold, and at least the backoff (5 s)."""
    h = Harness(max_s=60.0)
    h.add("u1")
    h.now = 1000.0
    record = {**h.record("u1", retry=60.0), "time": 1_795_000_000.0 + h.now + verdict_at}
    h.r.on_verdict({**record, "pod": {"uid": "other"}, "time": 10**400})  # a date no float holds: ignored
    h.r.on_verdict(record)
    h.now += due - 0.1
    assert await h.r.process_due() == 0
    h.now += 0.1
    assert await h.r.process_due() == 1


async def test_the_sweep_requeues_a_pod_whose_announced_hold_has_ended() -> None:
    """The sweep (pods delayed while no operator ran) took the condition's "retry in 60s" from the
    moment it read it, though the condition also says until when: a hold that ended ten minutes ago
    was waited out once more."""
    h = Harness(max_s=60.0)
    h.add("u1")
    h.now = 1000.0
    until = 1_795_000_000.0 + h.now - 600
    h.index["u1"] = PendingPod("u1", "ns", "pod-u1", 0, True, 60.0, None, delayed_until=until)
    msg = "0/4 nodes are available: 4 delayed by policy rl-scheduler until 2026-11-18T11:13:20Z (retry in 60s): busy."
    assert pending_pod(pod_body(message=msg), ANN).delayed_until == 1_795_000_000.0 + 401  # cut to the second
    assert h.r.sweep() == 1
    h.now += 5.0  # the backoff's floor, not the whole hold again
    assert await h.r.process_due() == 1


async def test_gone_or_bound_pods_are_dropped() -> None:
    h = Harness()
    h.add("u1")
    h.r.on_verdict(h.record("u1"))
    del h.index["u1"]  # bound meanwhile: no longer in the pending index
    h.now = 100
    await h.r.process_due()
    assert h.patched() == []
    h.add("u2")
    h.r.on_verdict(h.record("u2"))
    h.kube.pods[("ns", "pod-u2")]["metadata"]["uid"] = "recreated"
    await h.r.process_due()
    assert h.r.requeued == 0  # 409 on the uid precondition: dropped


async def test_transient_errors_retry() -> None:
    h = Harness()
    h.add("u1")
    h.kube.fail["patch_pod"] = KubeError(503, "ServiceUnavailable", "etcd leader changed")
    h.r.on_verdict(h.record("u1"))
    h.now = 5
    await h.r.process_due()
    assert h.r.scheduled == 1
    del h.kube.fail["patch_pod"]
    h.now = 10
    await h.r.process_due()
    assert h.r.requeued == 1


async def test_a_requeue_that_keeps_failing_backs_off_and_is_dropped(caplog) -> None:
    """A pod patch that always answers 500 (a broken webhook) was retried every 5 s forever, logged
    every time and counted nowhere: 17,280 calls a day."""
    h = Harness()
    h.add("u1")
    h.kube.fail["patch_pod"] = KubeError(500, "InternalError", "webhook failed")
    h.r.on_verdict(h.record("u1"))
    for _ in range(200):  # simulated time: each round jumps to the next due requeue
        if not h.r.scheduled:
            break
        h.now = min(entry[0] for entry in h.r._due.values())
        await h.r.process_due()
    calls = [c for c in h.kube.calls if c[0] == "patch_pod"]
    assert len(calls) == 1 + MAX_TRANSIENT_RETRIES and h.r.scheduled == 0 and h.r.failed == 1
    assert h.now < 20 * 60  # backoff capped at 5 minutes: dropped after about 15 minutes
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and "pod-u1" in r.getMessage()]
    assert len(warnings) == 2  # once when it starts failing, once when it is dropped


async def test_gives_up_with_an_event_after_max_attempts() -> None:
    h = Harness()
    h.add("u1", attempt=3)
    h.r.on_verdict(h.record("u1"))
    await asyncio.sleep(0)
    assert h.r.scheduled == 0 and h.r.given_up == 1
    assert [e["reason"] for e in h.kube.events] == ["RequeueGaveUp"]
    assert "delayed this pod 3 times" in h.kube.events[0]["message"]
    h.r.on_verdict(h.record("u1"))
    await asyncio.sleep(0)
    assert len(h.kube.events) == 1


async def test_sweep_finds_delayed_pods_nothing_announced() -> None:
    h = Harness()
    h.add("u1", delayed=True)
    h.add("u2", delayed=False)
    assert h.r.sweep() == 1 and h.r.scheduled == 1
    h.now = 5
    await h.r.process_due()
    assert h.patched() == [{ANN: "1"}]
    assert h.r.sweep() == 0  # just requeued: wait for the scheduler's verdict


async def test_run_loop_requeues_and_stops_on_cancel() -> None:
    h = Harness(initial_s=0.05, max_s=0.05, sweep_interval_s=0.05)
    import time

    h.r.clock = time.monotonic
    h.add("u1")
    task = asyncio.create_task(h.r.run())
    h.r.on_verdict(h.record("u1", retry=None))
    for _ in range(100):
        await asyncio.sleep(0.02)
        if h.r.requeued:
            break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert h.r.requeued == 1


async def test_rejections_post_an_event_and_an_annotation_once() -> None:
    kube = FakeKube()
    kube.add_pod("ns", "big", "u9")
    rej = Rejections(kube.patch_pod_annotations, kube.post_event)
    rec = {"verdict": "reject", "reason": "asks 64 GPUs", "pod": {"uid": "u9", "namespace": "ns", "name": "big"}}
    rej.on_verdict(rec)
    rej.on_verdict(rec)
    rej.on_verdict({"verdict": "delay", "pod": {"uid": "x"}})
    await asyncio.sleep(0.01)
    assert [e["reason"] for e in kube.events] == ["RejectedByPolicy"]
    # The only write: an rlsched.io/ annotation (a pod patch; no pods/status: the chart grants none).
    assert kube.calls == [
        (
            "patch_pod",
            "ns",
            "big",
            {"rlsched.io/policy-rejected": "the scheduling policy rejected this pod: asks 64 GPUs"},
        )
    ]
    assert kube.pods[("ns", "big")]["status"]["conditions"] == []
    await rej.close()


async def test_rejection_annotation_is_bounded_and_a_recreated_pod_is_left_alone() -> None:
    kube = FakeKube()
    kube.add_pod("ns", "big", "new-uid")  # recreated since the decision: the UID precondition fails
    kube.add_pod("ns", "long", "u1")
    rej = Rejections(kube.patch_pod_annotations, kube.post_event)
    rej.rejected("old-uid", "ns", "big", "too big")
    rej.rejected("u1", "ns", "long", "x" * 100_000)
    await asyncio.sleep(0.01)
    assert "rlsched.io/policy-rejected" not in kube.pods[("ns", "big")]["metadata"]["annotations"]
    assert (
        len(kube.pods[("ns", "long")]["metadata"]["annotations"]["rlsched.io/policy-rejected"])
        == Rejections.MAX_MESSAGE
    )
    await rej.close()


async def test_each_delay_says_until_when_in_an_event() -> None:
    h = Harness()
    h.add("u1", attempt=1)
    h.r.on_verdict(h.record("u1", retry=2.0))  # backoff 10 s (attempt 1, initial 5 s) beats the 2 s asked
    await asyncio.sleep(0)
    assert [e["reason"] for e in h.kube.events] == ["DelayedByPolicy"]
    assert h.kube.events[0]["type"] == "Normal"
    assert h.kube.events[0]["message"] == (
        "the scheduling policy delayed this pod; rlsched operator requeues it at 2026-11-18T11:06:50Z "
        "(in 10s; requeue 2 of 3)"
    )


# -- hostile inputs: one bad pod must never stop the others ------------------------------------------


@pytest.mark.parametrize(
    "retry",
    ["NaN", "Infinity", "-Infinity", "1e400", "-5", "1" + "0" * 400, "true", '"30"'],
    ids=["nan", "inf", "-inf", "1e400", "negative", "int-400-digits", "bool", "string"],
)
async def test_a_bad_retry_after_is_ignored_and_does_not_poison_the_heap(retry: str) -> None:
    # What the drainer hands the listener: json.loads reads NaN as nan and 1e400 as inf.
    h = Harness()
    for uid in ("bad", "good1", "good2"):
        h.add(uid)
    bad = json.loads(
        f'{{"verdict": "delay", "pod": {{"uid": "bad", "namespace": "ns", "name": "pod-bad"}}, '
        f'"retryAfterSeconds": {retry}}}'
    )
    h.r.on_verdict(bad)  # must not raise
    h.r.on_verdict(h.record("good1", retry=1.0))
    h.r.on_verdict(h.record("good2", retry=8.0))
    assert h.r.scheduled == 3
    h.now = 5.0  # the default backoff (initial 5 s) for the bad pod and good1; good2 asked 8 s
    assert await h.r.process_due() == 2
    assert sorted(c[2] for c in h.kube.calls if c[0] == "patch_pod") == ["pod-bad", "pod-good1"]
    h.now = 8.0
    assert await h.r.process_due() == 1
    assert h.r.requeued == 3 and h.r.scheduled == 0


async def test_a_retry_after_is_honoured_up_to_the_bound() -> None:
    h = Harness()  # maxS 20 s: up to 200 s honoured, a longer one cut to 200 s
    assert h.r.max_retry_after_s == requeue.RETRY_AFTER_FACTOR * 20.0 == 200.0
    assert h.r.backoff(0, 200.0) == 200.0 and h.r.backoff(0, 200.5) == h.r.backoff(0, 1e9) == 200.0
    assert h.r.backoff(0, float("nan")) == h.r.backoff(0, float("inf")) == h.r.backoff(0, -1.0) == 5.0


def test_a_condition_with_a_400_digit_retry_is_read_as_no_retry() -> None:
    msg = f"0/1 nodes are available: 1 delayed by policy rl (retry in {'9' * 400}s)"
    p = pending_pod(pod_body(message=msg), ANN)
    assert p is not None and p.delayed and p.retry_after_s is None


async def test_a_sweep_over_a_pod_with_a_400_digit_retry_schedules_everyone() -> None:
    h = Harness()
    for uid, retry in (("bad", "9" * 400), ("good", "3")):
        h.add(uid)
        msg = f"0/1 nodes are available: 1 delayed by policy rl (retry in {retry}s)"
        h.index[uid] = pending_pod(pod_body(uid, message=msg), ANN)
    assert h.r.sweep() == 2 and h.r.scheduled == 2
    h.now = 5.0
    assert await h.r.process_due() == 2
    assert h.patched() == [{ANN: "1"}, {ANN: "1"}]


async def test_one_pod_that_fails_does_not_stop_the_sweep_or_the_requeues(caplog) -> None:
    h = Harness()
    for uid in ("a", "bad", "c"):
        h.add(uid, delayed=True)
    lookup = h.r.lookup

    def exploding(uid: str) -> PendingPod | None:
        if uid == "bad":
            raise RuntimeError("index mid-update")
        return lookup(uid)

    h.r.lookup = exploding
    with caplog.at_level(logging.ERROR, logger="rlsched.operator.requeue"):
        assert h.r.sweep() == 2  # "bad" skipped, the pods after it still scheduled
        assert h.r.sweep() == 0
    assert h.r.scheduled == 2 and h.r.failed == 2
    assert len([r for r in caplog.records if "pod-bad" in r.getMessage()]) == 1  # logged once
    # A requeue that raises something unexpected: that pod is dropped, the others go on.
    h.r.lookup = lookup
    patch = h.r.patch

    async def failing_patch(namespace: str, name: str, uid: str, annotations: dict) -> None:
        if name == "pod-a":
            raise RuntimeError("boom")
        await patch(namespace, name, uid, annotations)

    h.r.patch = failing_patch
    h.now = 5.0
    assert await h.r.process_due() == 1
    assert h.r.requeued == 1 and h.r.failed == 3 and h.r.scheduled == 0


class SpyPattern:
    """Wraps a compiled pattern and records the length of every string it is asked to search."""

    def __init__(self, pattern) -> None:
        self.pattern, self.lengths = pattern, []

    def search(self, text: str, *args):
        self.lengths.append(len(text))
        return self.pattern.search(text, *args)


def test_a_huge_condition_message_is_parsed_only_up_to_the_cap(monkeypatch) -> None:
    delayed, rejected = SpyPattern(requeue.DELAYED), SpyPattern(requeue.REJECTED)
    monkeypatch.setattr(requeue, "DELAYED", delayed)
    monkeypatch.setattr(requeue, "REJECTED", rejected)
    msg = "0/3 nodes are available: rejected by policy x: a" + " " * 40_000 + "b" + ("\t" * 1000 + "c") * 10
    p = pending_pod(pod_body(message=msg), ANN)
    assert delayed.lengths and rejected.lengths
    assert max(delayed.lengths + rejected.lengths) <= requeue.MAX_CONDITION_MESSAGE == 4096
    assert p is not None and p.rejected == "a"  # the reason is read from the first characters only


def test_the_rejected_reason_is_cut_at_preemption_without_backtracking() -> None:
    msg = "0/4 nodes are available: 4 rejected by policy rl: too big" + " " * 3000 + ". preemption: not helpful."
    assert pending_pod(pod_body(message=msg), ANN).rejected == "too big"
    m = requeue.REJECTED.search(msg)
    assert m is not None and m.end() == msg.index("too big")  # the pattern matches only the prefix


async def run_sweeps(h: Harness, seconds: float, step: float = 15.0) -> None:
    """The requeue loop over simulated time: a sweep and the due requeues every ``step`` seconds."""
    t = 0.0
    while t < seconds:
        h.now = t
        h.r.sweep()
        await h.r.process_due()
        await asyncio.sleep(0)
        t += step


@pytest.mark.parametrize("status", [400, 403, 422])
async def test_a_refused_requeue_is_counted_and_the_sweep_does_not_retry_it(
    status: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A patch refused for good (RBAC, the admission policy, an
    annotation key the API server rejects) was logged at INFO, not counted, and the 15 s sweep
    scheduled the pod again forever: a patch and a DelayedByPolicy event per pod every round (the
    annotation never moved, so maxAttempts never ended it)."""
    h = Harness()
    h.add("u1", delayed=True)
    h.kube.fail["patch_pod"] = KubeError(status, "Refused", "pods is forbidden")
    with caplog.at_level(logging.INFO, logger="rlsched.operator.requeue"):
        await run_sweeps(h, 3000.0)
    events = [e["reason"] for e in h.kube.events]
    assert len(h.patched()) == 1 and h.r.failed == 1 and h.r.scheduled == 0
    assert events == ["DelayedByPolicy"]
    about = [r for r in caplog.records if "pod-u1" in r.getMessage() and "refused" in r.getMessage()]
    assert [r.levelname for r in about] == ["WARNING"]  # once per pod
    # Deleted: its memory goes (bounded); a pod that is still pending would be scheduled again.
    h.r.forget("u1")
    assert h.r.sweep() == 1


async def test_a_requeue_dropped_after_transient_failures_stays_dropped() -> None:
    """The requeue was "dropped" after MAX_TRANSIENT_RETRIES, but the sweep
    brought the still-delayed pod back at once: the drop bounded nothing."""
    h = Harness()
    h.add("u1", delayed=True)
    h.kube.fail["patch_pod"] = KubeError(500, "InternalError", "webhook failed")
    await run_sweeps(h, 24 * 3600.0)
    assert len(h.patched()) == 1 + MAX_TRANSIENT_RETRIES and h.r.failed == 1 and h.r.scheduled == 0
    assert [e["reason"] for e in h.kube.events] == ["DelayedByPolicy"]


@pytest.mark.parametrize("status", [404, 409])
async def test_a_pod_deleted_or_recreated_before_its_requeue_is_no_failure(status: int) -> None:
    h = Harness()
    h.add("u1", delayed=True)
    h.kube.fail["patch_pod"] = KubeError(status, "Gone", "not there")
    h.r.sweep()
    h.now = 5.0
    await h.r.process_due()
    assert len(h.patched()) == 1 and h.r.failed == 0 and h.r.requeued == 0


async def test_a_patch_refused_once_with_401_is_retried_not_dropped() -> None:
    """Only 400, 403 and 422 refuse a patch for good: a 401 (a token being renewed, an authentication
    webhook's blip) ended the pod's requeues until it was deleted."""
    h = Harness()
    h.add("u1", delayed=True)
    h.kube.fail["patch_pod"] = KubeError(401, "Unauthorized", "token expired")
    h.r.sweep()
    h.now = 5.0
    await h.r.process_due()
    del h.kube.fail["patch_pod"]  # the token was renewed
    await run_sweeps(h, 3000.0)
    assert len(h.patched()) > 1 and h.r.requeued >= 1 and h.r.failed == 0


@pytest.mark.parametrize("status", [503, 403])
async def test_a_pod_deleted_while_its_patch_was_on_its_way_is_not_remembered(status: int) -> None:
    """forget() on DELETED ran before the patch's failure came back, which then remembered the dead UID
    again (retries and a due requeue, or the dropped set) until the memory's cap pushed it out."""
    h = Harness()
    h.add("u1", delayed=True)
    gate = asyncio.Event()

    async def slow(*_: Any, **__: Any) -> None:
        await gate.wait()
        raise KubeError(status, "Failed", "on its way")

    h.r.patch = slow
    h.r.sweep()
    h.now = 5.0
    task = asyncio.create_task(h.r.process_due())
    await asyncio.sleep(0)
    h.index.pop("u1")
    h.r.forget("u1")  # DELETED while the patch is in flight
    gate.set()
    await task
    assert "u1" not in h.r._retries and "u1" not in h.r._dropped and "u1" not in h.r._due


# -- bounded memories without churn ----------------------------------------------------------------


async def test_more_pods_given_up_than_the_memory_holds_are_not_told_again_every_sweep(monkeypatch) -> None:
    """Past MEMORY pods given up on, each sweep forgot the oldest to make room — exactly the pods it was
    about to look at — and posted RequeueGaveUp for all of them again, every 15 s (55,000 events per
    sweep at 55,000 pods). The annotation is the record: the sweep passes them over, and a delay tells
    each pod once, as long as the memory has room."""
    monkeypatch.setattr(requeue, "MEMORY", 3)
    h = Harness()
    for i in range(5):
        h.add(f"u{i}", attempt=3, delayed=True)
    await run_sweeps(h, 120.0)
    assert h.kube.events == [] and h.r.scheduled == 0  # the sweep never gives up: it says nothing
    for _round in range(4):  # kube-scheduler retries each pod; the extender delays it again
        for i in range(5):
            h.r.on_verdict(h.record(f"u{i}"))
        await run_sweeps(h, 60.0)
        await asyncio.sleep(0)
    told = [e["ref"]["name"] for e in h.kube.events if e["reason"] == "RequeueGaveUp"]
    assert sorted(told) == ["pod-u0", "pod-u1", "pod-u2"] and h.r.given_up == 3 and len(h.r._gave_up) == 3
    assert h.patched() == []


async def test_a_full_given_up_memory_makes_room_for_pods_still_pending(monkeypatch) -> None:
    """Guard: a memory that forgets nothing to make room must not fill up for good with pods that
    were bound meanwhile (their deletion may be years away): the sweep drops those."""
    monkeypatch.setattr(requeue, "MEMORY", 2)
    h = Harness()
    for i in range(3):
        h.add(f"u{i}", attempt=3, delayed=True)
        h.r.on_verdict(h.record(f"u{i}"))
    await asyncio.sleep(0)
    assert h.r.given_up == 2
    del h.index["u0"]  # bound
    h.r.sweep()
    h.r.on_verdict(h.record("u2"))
    await asyncio.sleep(0)
    assert h.r.given_up == 3 and set(h.r._gave_up) == {"u1", "u2"}


async def test_more_refused_requeues_than_the_namespace_memory_holds_pause_instead_of_churning(
    monkeypatch,
) -> None:
    """Past MEMORY pods whose patch was refused for good, the oldest were forgotten and the next
    sweep scheduled exactly those again: a refused patch and a DelayedByPolicy event for each, every
    round, forever. Nothing on the pod records a refusal, so a namespace whose memory is full pauses
    its requeues until some of those pods are deleted or bound."""
    monkeypatch.setattr(requeue, "NAMESPACE_MEMORY", 3)
    h = Harness()
    for i in range(5):
        h.add(f"u{i}", delayed=True)
    h.kube.fail["patch_pod"] = KubeError(403, "Forbidden", "pods is forbidden")
    await run_sweeps(h, 3000.0)
    assert len(h.patched()) == 5 and h.r.failed == 5 and h.r.paused_namespaces == {"ns"}
    assert [e["reason"] for e in h.kube.events] == ["DelayedByPolicy"] * 5
    h.r.on_verdict(h.record("u4"))  # paused: a delay schedules nothing either
    assert h.r.scheduled == 0
    # The patches are allowed again and two of the pods are bound: room, and the requeues go on.
    del h.kube.fail["patch_pod"]
    for uid in ("u0", "u1"):
        del h.index[uid]
    h.now = 3000.0
    assert h.r.sweep() == 2 and not h.r.paused_namespaces


async def test_one_namespaces_refused_requeues_pause_only_that_namespace(monkeypatch, caplog) -> None:
    """50,000 pending pods of one namespace whose patch was refused for good (its own admission policy,
    pods whose annotations are full) paused the requeues of every pod in every namespace. The pause is
    per namespace now, logged once for it, saying how it ends."""
    monkeypatch.setattr(requeue, "NAMESPACE_MEMORY", 2)
    h = Harness()
    for i in range(4):
        h.add(f"a{i}", delayed=True, namespace="tenant-a")
    refused = KubeError(422, "Invalid", "metadata.annotations: Too long")

    async def patch(namespace: str, name: str, uid: str, annotations: Any) -> None:
        if namespace == "tenant-a":
            raise refused
        await h.kube.patch_pod_annotations(namespace, name, uid, annotations)

    h.r.patch = patch
    with caplog.at_level(logging.ERROR, logger="rlsched.operator.requeue"):
        await run_sweeps(h, 300.0)
        assert h.r.paused_namespaces == {"tenant-a"} and h.r.failed == 4
        h.now = 0.0  # run_sweeps starts its clock at 0
        h.add("b1", delayed=True, namespace="team-b")
        h.r.on_verdict(h.record("b1"))
        h.add("a9", delayed=True, namespace="tenant-a")
        h.r.on_verdict(h.record("a9"))  # tenant-a pauses: nothing scheduled for it
        assert set(h.r._due) == {"b1"}
        await run_sweeps(h, 300.0)
    assert h.kube.pods[("team-b", "pod-b1")]["metadata"]["annotations"][ANN] == "1"
    pauses = [r.getMessage() for r in caplog.records if "no requeue is scheduled" in r.getMessage()]
    assert len(pauses) == 1 and "namespace tenant-a" in pauses[0] and "deleted or bound" in pauses[0]


async def test_a_full_memory_of_refused_requeues_retries_new_ones_with_backoff(monkeypatch, caplog) -> None:
    """Once MEMORY pods' requeues failed for good (none of their namespaces at its own cap), every
    requeue paused cluster-wide. Now a new failure is not remembered (logged once) and that pod is
    retried with the backoff (failures counted as requeues: then once every maxS), not every sweep;
    the other pods' requeues go on."""
    monkeypatch.setattr(requeue, "MEMORY", 2)
    h = Harness(max_s=120.0)
    for i in range(3):
        h.add(f"a{i}", delayed=True, namespace=f"tenant-{i}")
    h.kube.fail["patch_pod"] = KubeError(403, "Forbidden", "pods is forbidden")
    with caplog.at_level(logging.ERROR, logger="rlsched.operator.requeue"):
        await run_sweeps(h, 3600.0)
    tries = [c[2] for c in h.kube.calls if c[0] == "patch_pod"]
    # a0 and a1 remembered after one try; a2 tried again 5, 10, 20, 40, 80 s, then 120 s after each
    # failure (on the next 15 s step): about 30 tries in an hour, where every sweep would be 240
    assert tries.count("pod-a0") == 1 and tries.count("pod-a1") == 1 and 25 <= tries.count("pod-a2") <= 40
    assert not h.r.paused_namespaces and len(h.r._unkept) == 1 and h.r.failed == len(tries)
    full = [r for r in caplog.records if "are not remembered" in r.getMessage()]
    assert len(full) == 1
    # Another pod still gets its requeue.
    del h.kube.fail["patch_pod"]
    h.add("b1", delayed=True, namespace="team-b")
    await run_sweeps(h, 60.0)
    assert h.kube.pods[("team-b", "pod-b1")]["metadata"]["annotations"][ANN] == "1"
