"""Pods filter refused moments before its watch saw room free get a ``room`` record, which the operator
answers with a requeue (rlsched.extender.refused): kube-scheduler saw that release first, and the
event that would have retried them was gone. Refusals older than the window, pods that still do not
fit, pods of another scheduler and pods whose rules keep them off the node get none."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from rlsched.extender.objects import assignment_annotations
from rlsched.extender.refused import RACE_WINDOW_S
from rlsched.extender.settings import GpuConventions
from rlsched.extender.testing import Harness, make_node, make_pod
from rlsched.extender.wire import ExtenderArgs

GPU = GpuConventions()


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def full(*nodes: str, labels: dict[str, str] | None = None) -> tuple[Harness, Clock]:
    """Nodes of one card each, held by a running whole-card pod ``run-<node>``."""
    running = [
        make_pod(f"run-{n}", gpus=1, node=n, uid=f"run-{n}", annotations=assignment_annotations(GPU, n, (0,), 1000))
        for n in nodes
    ]
    h = Harness([make_node(n, gpus=1, labels=labels) for n in nodes], running)
    clock = Clock()
    h.extender.refused.clock = clock
    return h, clock


def pending(h: Harness, name: str, **kw: Any) -> dict[str, Any]:
    pod = make_pod(name, uid=name, **kw)
    h.add_pod(copy.deepcopy(pod))
    h.cache.set_pod(copy.deepcopy(pod))
    return pod


async def refuse(h: Harness, pod: dict[str, Any], nodes: list[str]) -> None:
    answer = await h.extender.filter(ExtenderArgs(copy.deepcopy(pod), nodes, None))
    assert answer["NodeNames"] == []


async def depart(h: Harness, uid: str) -> None:
    """The watch delivers a pod's deletion; the check runs once that event is applied."""
    h.cache.delete_pod(uid)
    await asyncio.sleep(0)


def rooms(h: Harness) -> list[dict[str, Any]]:
    return [r for r in h.ring.read(0)["records"] if r["kind"] == "room"]


async def test_a_pod_refused_just_before_room_freed_where_it_fits_gets_one_room_record() -> None:
    h, clock = full("g0", "g1")
    pod = pending(h, "p", gpus=1)
    await refuse(h, pod, ["g0", "g1"])
    clock.t += 0.2  # the watch delivers the deletion kube-scheduler acted on already
    await depart(h, "run-g1")
    assert [(r["pod"]["name"], r["node"]) for r in rooms(h)] == [("p", "g1")]
    await depart(h, "run-g0")  # once is enough: the operator requeues it
    assert len(rooms(h)) == 1


async def test_no_room_record_for_an_old_refusal_a_pod_that_still_does_not_fit_or_another_schedulers() -> None:
    h, clock = full("g0", "g1")
    await refuse(h, pending(h, "old", gpus=1), ["g0"])
    clock.t += RACE_WINDOW_S + 0.1  # kube-scheduler saw the release after this refusal: it retries it
    await depart(h, "run-g0")
    assert rooms(h) == []

    h, clock = full("g0", "g1")
    await refuse(h, pending(h, "big", gpus=2), ["g0", "g1"])  # two cards: no node has them
    await depart(h, "run-g0")
    assert rooms(h) == []

    h, clock = full("g0")
    theirs = pending(h, "theirs", gpus=1, scheduler="default-scheduler")
    await h.extender.filter(ExtenderArgs(copy.deepcopy(theirs), ["g0"], None))
    await depart(h, "run-g0")
    assert rooms(h) == []


async def test_no_room_record_where_the_pods_own_rules_keep_it_off_the_node() -> None:
    h, _ = full("g0", labels={"pool": "a"})
    pod = make_pod("p", uid="p", gpus=1)
    pod["spec"]["nodeSelector"] = {"pool": "b"}
    h.add_pod(copy.deepcopy(pod))
    h.cache.set_pod(copy.deepcopy(pod))
    await refuse(h, pod, ["g0"])
    await depart(h, "run-g0")
    assert rooms(h) == []


async def test_a_pod_filtered_again_is_decided_afresh_not_remembered() -> None:
    """p is refused, then the node grows a card (no release: a rebuild) and p's next filter holds it:
    a release elsewhere within the window is no reason to requeue p."""
    h, clock = full("g0", "g1")
    pod = pending(h, "p", gpus=1)
    await refuse(h, pod, ["g0"])
    h.cache.set_node(make_node("g0", gpus=2, rv="2"))
    answer = await h.extender.filter(ExtenderArgs(copy.deepcopy(pod), ["g0"], None))
    assert answer["NodeNames"] == ["g0"]
    await depart(h, "run-g1")
    assert rooms(h) == []


async def test_no_room_record_where_the_pod_was_not_offered_or_the_room_is_retaken_in_the_same_step() -> None:
    h, _ = full("g0", "g1")
    await refuse(h, pending(h, "p", gpus=1), ["g0"])  # kube-scheduler's own filters ruled g1 out
    await depart(h, "run-g1")
    assert rooms(h) == []

    h, _ = full("g0")
    await refuse(h, pending(h, "p", gpus=1), ["g0"])
    h.cache.delete_pod("run-g0")
    h.cache.set_pod(make_pod("other", gpus=1, node="g0", uid="other", scheduler="default-scheduler"))
    await asyncio.sleep(0)  # both events applied before the check: no room on g0
    assert rooms(h) == []


async def test_no_room_record_on_a_node_not_offered_after_a_rebuild() -> None:
    """The offered node indices belong to the state of the refusal: after a rebuild they name other
    nodes, so such a refusal is dropped rather than matched against any node."""
    h, _ = full("g0", "g1")
    await refuse(h, pending(h, "p", gpus=1), ["g0"])
    h.cache.set_node(make_node("g9", gpus=0))  # an unrelated node joins: the state is rebuilt
    await depart(h, "run-g1")
    assert rooms(h) == []


async def test_one_feasibility_mask_per_distinct_request(monkeypatch) -> None:
    from rlsched.extender import refused

    h, _ = full("g0", "g1")
    for name in ("a", "b", "c"):
        await refuse(h, pending(h, name, gpus=1), ["g0", "g1"])
    calls = []
    real = refused.feasible_mask
    monkeypatch.setattr(refused, "feasible_mask", lambda s, r: calls.append(r) or real(s, r))
    h.cache.set_pod(make_pod("cpu-only", node="g0", uid="cpu-only"))
    await depart(h, "cpu-only")
    assert len(calls) == 1


async def test_no_room_record_on_a_relist_half_applied() -> None:
    """run-g0 finished (listed in the first slice), another scheduler's pod took g0 (the second): the
    check waits for the end of the relist, and by then g0 is full."""
    h, _ = full("g0")
    await refuse(h, pending(h, "p", gpus=1), ["g0"])
    done = make_pod(
        "run-g0", gpus=1, node="g0", uid="run-g0", annotations=assignment_annotations(GPU, "g0", (0,), 1000)
    )
    done["status"]["phase"] = "Succeeded"
    other = make_pod("other", gpus=1, node="g0", uid="other", scheduler="default-scheduler")
    filler = [make_pod(f"f{i}", node="g0", uid=f"f{i}", cpu="1m", memory="1Mi") for i in range(300)]
    for _ in h.cache.replace_pods_in_slices([done, *filler, other, make_pod("p", uid="p", gpus=1)], size=256):
        await asyncio.sleep(0)  # as the watch's relist does between slices
    await asyncio.sleep(0.1)
    assert rooms(h) == []
