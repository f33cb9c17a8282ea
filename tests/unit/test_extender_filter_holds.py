"""Filter's holds: taken only for pods the watch knows as ours and pending, at once (shadow mode too),
released for pods that are gone, and never on a node that pods placed during a slow decision filled.

A model run in a thread (``deadlineEnforcement: thread``) yields while it decides, so watch events
land in between; the timer mode (the default) does not yield, and the same tests run in it too."""

from __future__ import annotations

import asyncio
import copy
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlsched.extender.cache import MAX_PROVISIONAL_HOLDS, PROVISIONAL_HOLD_S
from rlsched.extender.settings import ExtenderSettings, PolicySettings
from rlsched.extender.testing import Harness, make_node, make_pod
from rlsched.extender.wire import BindingArgs, ExtenderArgs
from rlsched.policy.scorers import NodeScores, Scorer


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def watched(h: Harness, pod: dict) -> dict:
    h.add_pod(pod)
    h.cache.set_pod(copy.deepcopy(pod))
    return pod


async def filter_(h: Harness, pod: dict, nodes: list[str]) -> list[str]:
    return list((await h.extender.filter(ExtenderArgs(copy.deepcopy(pod), list(nodes), None)))["NodeNames"] or [])


class SlowModel(Scorer):
    """A learned scorer stand-in that takes 50 ms (so a thread-mode decision yields) and prefers
    ``favourite``."""

    name = "ppo"

    def __init__(self, favourite: str):
        self.version, self.digest, self.favourite = "v1", "d" * 64, favourite

    calls = 0

    def score(self, state: Any, req: Any, nodes: np.ndarray) -> NodeScores:
        SlowModel.calls += 1
        time.sleep(0.05)
        return NodeScores(np.array([1.0 if state.names[n] == self.favourite else 0.5 for n in nodes]))


def slow_harness(tmp_path: Path, nodes: list[dict], favourite: str, **policy: Any) -> Harness:
    marker = tmp_path / "model.json"
    marker.write_text("{}")
    settings = ExtenderSettings(policy=PolicySettings(model_path=str(marker), **policy))
    return Harness(nodes, [], settings, model_loader=lambda path, typical: SlowModel(favourite))


async def test_a_pod_only_the_request_describes_is_held_briefly_and_once() -> None:
    """Made-up pods used to hold every card for 30 s (and again at each filter): a real pod then
    found none. A pod the watch has not seen yet is held provisionally: released after
    PROVISIONAL_HOLD_S unless the watch shows it, and not held again."""
    clock = FakeClock()
    h = Harness([make_node("x", gpus=4), make_node("y", gpus=4)], [])
    h.cache.clock = clock
    for i in range(8):
        ghost = make_pod(f"ghost-{i}", uid=f"ghost-{i}", gpus=1)
        assert await filter_(h, ghost, ["x", "y"])
    assert {e.status for e in h.cache.pods.values()} == {"reserved"} and len(h.cache.pods) == 8
    clock.now += PROVISIONAL_HOLD_S + 1
    assert len(h.cache.expire_provisional()) == 8 and h.cache.pods == {}
    assert await filter_(h, make_pod("ghost-0", uid="ghost-0", gpus=1), ["x", "y"])  # asked again
    assert h.cache.pods == {}  # held once only
    bound = make_pod("bound", uid="bound", gpus=1, node="x")  # the request says it is bound
    theirs = make_pod("theirs", uid="theirs", gpus=1, scheduler="default-scheduler")
    h.cache.set_pod(copy.deepcopy(theirs))
    for pod in (bound, theirs):
        await filter_(h, pod, ["x", "y"])
    assert "bound" not in h.cache.pods and "theirs" not in h.cache.pods
    real = watched(h, make_pod("real", uid="real", gpus=1))
    assert await filter_(h, real, ["x", "y"]) and h.cache.pods["real"].status == "reserved"


async def test_a_request_with_a_pods_uid_under_another_name_leaves_its_hold_alone() -> None:
    h = Harness([make_node("x", gpus=1)], [])
    p = watched(h, make_pod("p", uid="p", gpus=1))
    assert await filter_(h, p, ["x"]) == ["x"]
    forged = make_pod("evil", uid="p", gpus=1)
    await filter_(h, forged, ["x"])
    assert h.cache.pods["p"].key == "default/p" and h.cache.pods["p"].status == "reserved"
    m = p["metadata"]
    assert (await h.extender.bind(BindingArgs(m["name"], m["namespace"], m["uid"], "x")))["Error"] == ""


async def test_a_relist_releases_the_hold_of_a_pod_that_is_gone() -> None:
    h = Harness([make_node("x", gpus=1)], [])
    p = watched(h, make_pod("p", uid="p", gpus=1))
    assert await filter_(h, p, ["x"]) == ["x"]
    del h.api.pods[("default", "p")]  # deleted while the watch was down
    items, _ = await h.api.list("/api/v1/pods")
    h.cache.replace_pods(items)
    assert h.cache.pods == {}


@pytest.mark.parametrize("enforcement", ["thread", "timer"])
async def test_a_node_filled_during_the_decision_is_not_kept(tmp_path: Path, enforcement: str) -> None:
    """While the model decides, a pod of another scheduler lands on x, leaving 2 of its 8 cpu: the
    pod (4 cpu) is decided again on what the cluster is now, and held on y."""
    h = slow_harness(
        tmp_path,
        [make_node("x", cpu="8", gpus=1), make_node("y", cpu="8", gpus=1)],
        "x",
        deadline_enforcement=enforcement,
    )
    p = watched(h, make_pod("p", uid="p", cpu="4", gpus=1))

    async def lands() -> None:
        await asyncio.sleep(0.01)
        h.cache.set_pod(make_pod("big", uid="big", cpu="6", node="x", scheduler="default-scheduler"))

    task = asyncio.create_task(lands())
    kept = await filter_(h, p, ["x", "y"])
    await task
    if enforcement == "timer":  # no yield: the pod was decided (and held) before big arrived
        assert kept == ["x"]
        return
    assert kept == ["y"] and h.cache.pods["p"].node == "y" and h.cache.pods["p"].status == "reserved"


async def test_a_node_added_during_the_decision_does_not_shift_the_names(tmp_path: Path) -> None:
    """A node sorting first arrived during a thread-mode decision: every index shifted by one, and
    the names array of the old state was kept for the new one, so filters answered wrong nodes."""
    nodes = [make_node(f"n-{c}", gpus=1) for c in "bcd"]
    h = slow_harness(tmp_path, nodes, "n-b", deadline_enforcement="thread", top_k=2)
    p = watched(h, make_pod("p", uid="p", gpus=1))

    async def node_event() -> None:
        await asyncio.sleep(0.01)
        h.cache.set_node(make_node("n-a", gpus=1))

    task = asyncio.create_task(node_event())
    kept = await filter_(h, p, ["n-b", "n-c", "n-d"])
    await task
    assert kept[0] == "n-b"
    state = h.cache.state
    assert state is not None and list(h.extender._names(state)) == list(state.names) == ["n-a", "n-b", "n-c", "n-d"]


@pytest.mark.parametrize("enforcement", ["thread", "timer"])
async def test_shadow_mode_holds_at_once(tmp_path: Path, enforcement: str) -> None:
    """In shadow mode the hold waited for the shadow policy: the next pod's filter found the node's
    only card free, and a pod deleted meanwhile got a hold after all."""
    h = slow_harness(tmp_path, [make_node("x", gpus=1)], "x", mode="shadow", deadline_enforcement=enforcement)
    a = watched(h, make_pod("a", uid="a", gpus=1))
    b = watched(h, make_pod("b", uid="b", gpus=1))
    assert await filter_(h, a, ["x"]) == ["x"]
    await asyncio.sleep(0)
    assert await filter_(h, b, ["x"]) == []
    h.cache.delete_pod("a")
    await asyncio.gather(*list(h.extender._shadow_tasks))
    assert h.cache.pods == {}
    (record,) = [r for r in h.ring.read(0)["records"] if r.get("kind") == "filter" and r["pod"]["name"] == "a"]
    assert "shadow" in record  # the shadow policy's look, recorded once it ran


async def test_in_thread_mode_bind_does_not_call_the_model_on_the_event_loop(tmp_path: Path) -> None:
    """Bind to another node than filter's choice asks the card rule for that node. In thread mode the
    model may be busy in its worker thread, and a call on the event loop would have no deadline:
    the fallback's card rule chooses."""
    h = slow_harness(tmp_path, [make_node("x", gpus=2), make_node("y", gpus=2)], "x", deadline_enforcement="thread")
    p = watched(h, make_pod("p", uid="p", gpus=1))
    assert await filter_(h, p, ["x", "y"]) == ["x"]
    before = SlowModel.calls
    m = p["metadata"]
    assert (await h.extender.bind(BindingArgs(m["name"], m["namespace"], m["uid"], "y")))["Error"] == ""
    assert SlowModel.calls == before and h.cache.pods["p"].node == "y"


async def test_a_provisional_hold_the_watch_confirms_lives_on() -> None:
    """At 100 pods/s kube-scheduler's informer saw a pod before our watch: without a hold the next
    pod's filter took the same share, and the first pod's bind failed."""
    clock = FakeClock()
    h = Harness([make_node("x", gpus=1)], [])
    h.cache.clock = clock
    first = make_pod("first", uid="first", gpu_milli=600)
    assert await filter_(h, first, ["x"]) == ["x"]  # the watch has not seen it yet
    assert h.cache.pods["first"].status == "reserved"
    second = watched(h, make_pod("second", uid="second", gpu_milli=600))
    assert await filter_(h, second, ["x"]) == []  # the share is held for the first
    watched(h, first)
    clock.now += PROVISIONAL_HOLD_S + 1
    assert h.cache.expire_provisional() == [] and h.cache.pods["first"].status == "reserved"
    m = first["metadata"]
    assert (await h.extender.bind(BindingArgs(m["name"], m["namespace"], m["uid"], "x")))["Error"] == ""


async def test_provisional_holds_are_capped() -> None:
    h = Harness([make_node(f"n{i}", gpus=8) for i in range(16)], [])
    names = [f"n{i}" for i in range(16)]
    for i in range(MAX_PROVISIONAL_HOLDS + 5):
        await filter_(h, make_pod(f"g{i}", uid=f"g{i}", gpu_milli=100), names)
    assert len(h.cache.pods) == MAX_PROVISIONAL_HOLDS


async def test_bound_provisional_holds_do_not_count_against_the_cap() -> None:
    h = Harness([make_node(f"n{i}", gpus=8) for i in range(16)], [])
    names = [f"n{i}" for i in range(16)]
    for i in range(MAX_PROVISIONAL_HOLDS + 5):
        p = make_pod(f"g{i}", uid=f"g{i}", gpu_milli=100)
        kept = await filter_(h, p, names)
        assert kept and h.cache.pods[f"g{i}"].status == "reserved"  # every one held: the earlier ones are bound
        m = p["metadata"]
        h.add_pod(p)
        assert (await h.extender.bind(BindingArgs(m["name"], m["namespace"], m["uid"], kept[0])))["Error"] == ""
    h.cache.expire_provisional()
    assert h.cache.provisional_live == {}


async def test_confirmed_provisional_holds_free_their_slot_at_once() -> None:
    """Holds the watch had confirmed kept their provisional slots until the next expiry tick (every
    ≤5 s): at 100 pods/s the 65th new pod got no hold though none was waiting for the watch."""
    h = Harness([make_node(f"n{i}", gpus=8) for i in range(20)], [])
    names = [f"n{i}" for i in range(20)]
    for i in range(MAX_PROVISIONAL_HOLDS):
        p = make_pod(f"g{i}", uid=f"g{i}", gpu_milli=100)
        await filter_(h, p, names)  # kube-scheduler's informer ahead of our watch ...
        h.cache.set_pod(copy.deepcopy(p))  # ... which shows the pod a moment later
    last = make_pod("last", uid="last", gpu_milli=100)
    assert await filter_(h, last, names)
    assert h.cache.pods["last"].status == "reserved"


class CardChoosingModel(Scorer):
    """Like the learned policy: a share's card is chosen while encoding, before a 50 ms inference."""

    name = "ppo"
    version, digest = "v1", "d" * 64

    def score(self, state: Any, req: Any, nodes: np.ndarray) -> NodeScores:
        from rlsched.policy.cards import default_cards

        cards = np.array([default_cards(state, req, int(n))[0] for n in nodes]) if req.is_share else None
        time.sleep(0.05)
        return NodeScores(np.ones(len(nodes)), cards)


async def test_a_card_taken_during_the_decision_is_decided_again(tmp_path: Path) -> None:
    """Thread mode: while the model decided for p, q's filter (the fallback, on the loop) held the card
    p's decision named. p kept its decision because the node still fitted on its other card, its
    hold of the taken card failed silently, and the next pod took the room p's bind needed."""
    (tmp_path / "m.json").write_text("{}")
    settings = ExtenderSettings(
        policy=PolicySettings(model_path=str(tmp_path / "m.json"), deadline_enforcement="thread")
    )
    h = Harness(
        [make_node("x", gpus=2), make_node("y", gpus=0, cpu="1", memory="1Gi")],
        [],
        settings,
        model_loader=lambda p, t: CardChoosingModel(),
    )
    p, q, r = (watched(h, make_pod(n, uid=n, gpu_milli=600)) for n in "pqr")

    async def q_meanwhile() -> None:
        await asyncio.sleep(0.01)
        assert await filter_(h, q, ["x", "y"]) == ["x"]

    task = asyncio.create_task(q_meanwhile())
    assert await filter_(h, p, ["x", "y"]) == ["x"]
    await task
    assert h.cache.pods["p"].status == "reserved" and h.cache.pods["p"].cards != h.cache.pods["q"].cards
    assert await filter_(h, r, ["x", "y"]) == []  # both cards are held
    for pod in (q, p):
        m = pod["metadata"]
        assert (await h.extender.bind(BindingArgs(m["name"], m["namespace"], m["uid"], "x")))["Error"] == ""
