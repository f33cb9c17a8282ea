"""The operator's half of rlsched.extender.refused: a ``room`` record (filter refused the pod moments
before its watch saw room free where the pod fits) reaches the requeuer, which requeues the pod after
the backoff, within ``maxAttempts``, without the events of a delay."""

from __future__ import annotations

from test_operator_decisionlog import RingClient
from test_operator_requeue import ANN, Harness

from rlsched.operator.decisionlog import Drainer


def room(uid: str) -> dict:
    return {"kind": "room", "pod": {"uid": uid, "namespace": "ns", "name": f"pod-{uid}"}, "node": "g0"}


async def test_a_room_record_requeues_the_pod_after_the_backoff_without_an_event() -> None:
    h = Harness()
    h.add("u1")
    h.r.on_room(room("u1"))
    h.r.on_room(room("u1"))  # twice: scheduled once
    assert h.r.scheduled == 1
    h.now = 4.9
    assert await h.r.process_due() == 0
    h.now = 5.0
    assert await h.r.process_due() == 1
    assert h.patched() == [{ANN: "1"}]
    assert h.kube.events == []  # nothing the policy did: no event


async def test_a_room_record_for_a_pod_not_pending_or_out_of_attempts_does_nothing() -> None:
    h = Harness()
    h.r.on_room(room("gone"))  # bound or deleted since
    h.add("tired", attempt=3)  # maxAttempts 3 spent: kube-scheduler retries it at the next event
    h.r.on_room(room("tired"))
    h.r.on_room({"kind": "room", "pod": "not a mapping"})
    h.r.on_room({"kind": "filter", "verdict": "delay", "pod": {"uid": "tired"}})  # not a room record
    assert h.r.scheduled == 0 and not h.kube.calls and h.kube.events == []


async def test_the_drainer_hands_room_records_to_the_listeners_once() -> None:
    client = RingClient(size=8)
    seen: list[dict] = []
    d = Drainer(client, None, [seen.append])
    client.ring.append(room("u1"))
    assert await d.drain_once() == 1 and await d.drain_once() == 0
    assert [r["kind"] for r in seen] == ["room"]
