"""Preempt's trial: a node is kept only where the preemptor fits once the victims are gone, counting
what takes their room before it does — running pods the cache could not count, and pods nominated
to the node with at least the preemptor's priority (kube-scheduler's own fit check counts those)."""

from __future__ import annotations

import copy
from typing import Any

from rlsched.extender.testing import Harness, make_node, make_pod
from rlsched.extender.wire import ExtenderArgs, preemption_args


def prio(pod: dict[str, Any], priority: int) -> dict[str, Any]:
    pod["spec"]["priority"] = priority
    return pod


def nominated(pod: dict[str, Any], node: str) -> dict[str, Any]:
    pod["status"]["nominatedNodeName"] = node
    return pod


def pending(h: Harness, pod: dict[str, Any]) -> dict[str, Any]:
    """A pending pod that the fake API and the watch both hold."""
    h.add_pod(copy.deepcopy(pod))
    h.cache.set_pod(copy.deepcopy(pod))
    return pod


async def preempt(h: Harness, pod: dict[str, Any], victims: dict[str, list[str]]) -> dict[str, Any]:
    meta = {node: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 0} for node, uids in victims.items()}
    return await h.extender.preempt(preemption_args({"Pod": pod, "NodeNameToMetaVictims": meta}))


def small(name: str, **kw: Any) -> dict[str, Any]:
    return make_pod(name, cpu="1", memory="1Gi", uid=name, **kw)


# -- running pods the cache could not count ---------------------------------------------------------


async def test_preempt_drops_a_node_whose_uncounted_running_pod_takes_the_victims_room() -> None:
    """W, started on g0 by another scheduler while no whole card was free there, runs uncounted. The
    trial released the victim V and saw its card free for P; the cache counts W on that card first
    when V goes, so P still did not fit and V was evicted for nothing."""
    share = prio(small("s", gpu_milli=500, node="g0"), 2000)  # card 0, not a victim
    victim = small("v", gpus=1, node="g0")  # card 1
    h = Harness([make_node("g0", gpus=2)], [share, victim])
    h.cache.set_pod(small("w", gpus=1, node="g0", scheduler="default-scheduler"))
    assert h.cache.pods["w"].placement is None  # runs there, uncounted
    pod = pending(h, prio(small("p", gpus=1), 500))
    assert await preempt(h, pod, {"g0": ["v"]}) == {"NodeNameToMetaVictims": {}}
    h.cache.delete_pod("v")  # what the eviction would have led to
    ans = await h.extender.filter(ExtenderArgs(copy.deepcopy(pod), ["g0"], None))
    assert ans["NodeNames"] == [] and h.cache.pods["w"].placement is not None


async def test_preempt_keeps_a_node_with_room_for_its_uncounted_pod_and_the_preemptor() -> None:
    """Two victims free two cards: the uncounted W takes one, P the other (the node is not dropped
    merely for holding an uncounted pod)."""
    share = prio(small("s", gpu_milli=500, node="g0"), 2000)
    v1, v2 = small("v1", gpus=1, node="g0"), small("v2", gpus=1, node="g0")
    h = Harness([make_node("g0", gpus=3)], [share, v1, v2])
    h.cache.set_pod(small("w", gpus=1, node="g0", scheduler="default-scheduler"))
    assert h.cache.pods["w"].placement is None
    pod = pending(h, prio(small("p", gpus=1), 500))
    out = await preempt(h, pod, {"g0": ["v1", "v2"]})
    assert out == {"NodeNameToMetaVictims": {"g0": {"Pods": [{"UID": "v1"}, {"UID": "v2"}], "NumPDBViolations": 0}}}
    assert h.cache.pods["w"].placement is None  # the trial left the cache as it was


# -- pods nominated to the node ---------------------------------------------------------------------


def nominated_cluster(n_priority: int, nominate: bool = True) -> tuple[Harness, dict[str, Any]]:
    """g0 (4 cards): share pod S on card 0 (not a victim), A on card 1 (the victim); N (2 cards,
    ``n_priority``) pending, nominated to g0 when ``nominate``; P (2 cards, priority 500) preempts."""
    share = prio(small("s", gpu_milli=500, node="g0"), 2000)
    a = small("a", gpus=1, node="g0")
    h = Harness([make_node("g0", gpus=4)], [share, a])
    n = prio(small("n", gpus=2), n_priority)
    pending(h, nominated(n, "g0") if nominate else n)
    return h, pending(h, prio(small("p", gpus=2), 500))


async def test_preempt_counts_a_higher_priority_pod_nominated_to_the_node() -> None:
    """kube-scheduler's dry run counts N (nominated to g0, higher priority) by its whole-card count
    and proposes A; by the cards, once A goes N takes two of the three free cards and P (two cards)
    does not fit. The trial ignored N and kept g0: A evicted, P still waiting."""
    h, pod = nominated_cluster(1000)
    assert await preempt(h, pod, {"g0": ["a"]}) == {"NodeNameToMetaVictims": {}}
    assert h.cache.state.full_free[h.cache.state.index["g0"]] == 2  # the trial left the state as it was


async def test_preempt_ignores_a_lower_priority_pod_nominated_to_the_node() -> None:
    """A nominated pod of lower priority is not counted (kube-scheduler does not either): P goes first."""
    h, pod = nominated_cluster(100)
    out = await preempt(h, pod, {"g0": ["a"]})
    assert out == {"NodeNameToMetaVictims": {"g0": {"Pods": [{"UID": "a"}], "NumPDBViolations": 0}}}


async def test_a_nomination_written_later_reaches_the_cache() -> None:
    """kube-scheduler writes nominatedNodeName into the status of a pod the watch has seen already:
    the cache must not take it for a status update that changes nothing it reads (the nomination
    would never reach preempt's trial)."""
    h, pod = nominated_cluster(1000, nominate=False)
    kept = {"NodeNameToMetaVictims": {"g0": {"Pods": [{"UID": "a"}], "NumPDBViolations": 0}}}
    assert await preempt(h, pod, {"g0": ["a"]}) == kept  # N not nominated yet: it does not count
    later = nominated(prio(small("n", gpus=2, rv="2001"), 1000), "g0")
    h.cache.set_pod(later)
    assert await preempt(h, pod, {"g0": ["a"]}) == {"NodeNameToMetaVictims": {}}
