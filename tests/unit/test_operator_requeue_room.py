"""The operator's half of rlsched.extender.refused: a ``room`` record (filter refused the pod moments
before its watch saw room free where the pod fits) reaches the requeuer, which requeues the pod by
its own annotation, at most ``ROOM_REQUEUES`` times, apart from the delays' ``maxAttempts`` and
without their events; a delay replaces a pending room requeue."""

from __future__ import annotations

import asyncio

from test_operator_decisionlog import RingClient
from test_operator_requeue import ANN, Harness

from rlsched.operator.decisionlog import Drainer
from rlsched.operator.requeue import ROOM_ANNOTATION, ROOM_REQUEUES


def room(uid: str) -> dict:
    return {"kind": "room", "pod": {"uid": uid, "namespace": "ns", "name": f"pod-{uid}"}, "node": "g0"}


async def test_a_room_record_requeues_the_pod_by_its_own_annotation_without_an_event() -> None:
    h = Harness()
    h.add("u1", attempt=3)  # the delays' maxAttempts (3) spent: room requeues count apart
    h.r.on_room(room("u1"))
    h.r.on_room(room("u1"))  # twice: scheduled once
    assert h.r.scheduled == 1
    h.now = 4.9
    assert await h.r.process_due() == 0
    h.now = 5.0
    assert await h.r.process_due() == 1
    assert h.patched() == [{ROOM_ANNOTATION: "1"}]
    await asyncio.sleep(0)
    assert h.kube.events == []  # nothing the policy did: no event


async def test_room_requeues_stop_at_their_cap() -> None:
    h = Harness()
    h.add("u1")
    for _ in range(ROOM_REQUEUES + 2):
        h.r.on_room(room("u1"))
        h.now += 5.0
        await h.r.process_due()
    assert h.patched() == [{ROOM_ANNOTATION: str(n)} for n in range(1, ROOM_REQUEUES + 1)]


async def test_a_delay_replaces_a_pending_room_requeue() -> None:
    h = Harness()
    h.add("u1")
    h.r.on_room(room("u1"))
    h.r.on_verdict(h.record("u1", retry=60.0))  # the policy holds the pod: its hold, its event
    await asyncio.sleep(0)
    assert [e["reason"] for e in h.kube.events] == ["DelayedByPolicy"]
    h.now = 5.0
    assert await h.r.process_due() == 0  # not patched inside the hold
    h.now = 60.0
    assert await h.r.process_due() == 1
    assert h.patched() == [{ANN: "1"}]


async def test_a_room_record_for_a_pod_not_pending_does_nothing() -> None:
    h = Harness()
    h.r.on_room(room("gone"))  # bound or deleted since
    h.r.on_room({"kind": "room", "pod": "not a mapping"})
    h.add("u1")
    h.r.on_room({"kind": "filter", "verdict": "delay", "pod": {"uid": "u1"}})  # not a room record
    await asyncio.sleep(0)
    assert h.r.scheduled == 0 and not h.kube.calls and h.kube.events == []


async def test_the_drainer_hands_room_records_to_the_listeners_once() -> None:
    client = RingClient(size=8)
    seen: list[dict] = []
    d = Drainer(client, None, [seen.append])
    client.ring.append(room("u1"))
    assert await d.drain_once() == 1 and await d.drain_once() == 0
    assert [r["kind"] for r in seen] == ["room"]


async def test_a_pod_the_delays_gave_up_on_may_still_be_requeued_for_room() -> None:
    h = Harness()
    h.add("u1", attempt=3)
    h.r.on_verdict(h.record("u1"))  # delayed again at maxAttempts (3): RequeueGaveUp
    h.r.on_room(room("u1"))
    assert h.r.scheduled == 1


async def test_a_delays_retry_is_not_turned_into_a_room_requeue() -> None:
    """The delay's patch fails (503) while a room record arrives: the retry is the delay's own."""
    from rlsched.operator.kube import KubeError

    h = Harness()
    h.add("u1")
    sent: list[dict] = []

    async def patch(namespace: str, name: str, uid: str, annotations: dict) -> dict:
        sent.append(dict(annotations))
        if len(sent) == 1:
            h.r.on_room(room("u1"))
            raise KubeError(503, "Service Unavailable", "later")
        return {}

    h.r.patch = patch
    h.r.on_verdict(h.record("u1", retry=None))
    for t in (5.0, 10.0, 40.0):
        h.now = t
        await h.r.process_due()
    assert sent == [{ANN: "1"}, {ANN: "1"}]


def test_the_requeue_annotation_cannot_be_one_of_the_operators_own() -> None:
    import pytest

    from rlsched.operator.settings import REJECTED_ANNOTATION, SettingsError, from_mapping, validate

    for key in (ROOM_ANNOTATION, REJECTED_ANNOTATION):
        with pytest.raises(SettingsError, match="reserved"):
            validate(from_mapping({"requeue": {"annotation": key}}))
