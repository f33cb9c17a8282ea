"""Requeue of delayed pods (backoff, cap, give-up, dropped pods) and notices for rejected pods."""

from __future__ import annotations

import asyncio

import pytest

from rlsched.operator.kube import KubeError
from rlsched.operator.requeue import PendingPod, Rejections, Requeuer, pending_pod
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
    assert p == PendingPod("u1", "ns", "pod-u1", 2, True, 30.0, None)
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

    def add(self, uid: str, attempt: int = 0, delayed: bool = False) -> None:
        self.kube.add_pod("ns", f"pod-{uid}", uid, {ANN: str(attempt)} if attempt else {})
        self.index[uid] = PendingPod(uid, "ns", f"pod-{uid}", attempt, delayed, None, None)

    def record(self, uid: str, retry: float | None = 1.0) -> dict:
        return {
            "kind": "filter",
            "verdict": "delay",
            "retryAfterSeconds": retry,
            "pod": {"uid": uid, "namespace": "ns", "name": f"pod-{uid}"},
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
