"""Edges of the requeue's memory that the main tests leave open: a deleted pod (:meth:`Requeuer.forget`)
must leave nothing behind that changes what happens to the pods still pending."""

from __future__ import annotations

import asyncio

from test_operator_requeue import Harness

from rlsched.operator import requeue


async def test_a_deleted_pod_given_up_on_leaves_room_to_tell_the_next_one(monkeypatch) -> None:
    monkeypatch.setattr(requeue, "MEMORY", 1)
    h = Harness()
    h.add("u1", attempt=3)
    h.r.on_verdict(h.record("u1"))
    await asyncio.sleep(0)
    assert h.r.given_up == 1
    del h.index["u1"]  # deleted: the DELETED event reaches forget()
    h.r.forget("u1")
    h.add("u2", attempt=3)
    h.r.on_verdict(h.record("u2"))  # no sweep in between: forget() alone must have made the room
    await asyncio.sleep(0)
    told = [e["ref"]["name"] for e in h.kube.events if e["reason"] == "RequeueGaveUp"]
    assert told == ["pod-u1", "pod-u2"] and h.r.given_up == 2


async def test_a_deleted_pods_last_requeue_does_not_push_out_a_pending_pods(monkeypatch) -> None:
    """The memory of last requeues forgets its oldest past MEMORY: a deleted pod's entry left there
    pushed out a pending pod's, and the sweep requeued that one again before its backoff."""
    monkeypatch.setattr(requeue, "MEMORY", 2)
    h = Harness()
    h.add("a-live", delayed=True)
    h.add("b-gone")
    h.add("c")
    h.r.on_verdict(h.record("a-live"))
    h.r.on_verdict(h.record("b-gone"))
    h.now = 1.0
    h.r.on_verdict(h.record("c"))
    h.now = 5.0
    assert await h.r.process_due() == 2  # a-live, then b-gone
    del h.index["b-gone"]
    h.r.forget("b-gone")
    h.now = 6.0
    assert await h.r.process_due() == 1  # c
    assert h.r.sweep() == 0  # a-live was requeued 1 s ago: its backoff (5 s) has not passed
    assert h.r.scheduled == 0
