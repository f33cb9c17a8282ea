"""The policy engine's failure paths: a model that fails at start stays reported, a bad typical-pods
path in the policy file does not stop start-up, a hung model call in thread mode does not outlive a
reload, bind never runs the model beside a running call, and caches computed while a thread-mode call
runs are not stamped with versions they never saw."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

import rlsched.policy.fragmentation as fragmentation
from rlsched.extender.policy import PolicyEngine, default_typical
from rlsched.extender.settings import PolicySettings
from rlsched.policy.cluster import ClusterState, NodeSpec, PodSpec
from rlsched.policy.scorers import NodeScores, Scorer, TieBreak


class Model(Scorer):
    """Scores every node 0; sleeps ``slow`` seconds a call; counts calls running at once."""

    name = "ppo"
    digest = "d" * 64

    def __init__(self, version: str = "v1", slow: float = 0.0):
        self.version, self.slow = version, slow
        self.inside = self.most_inside = 0

    def score(self, state, req, nodes):
        self.inside += 1
        self.most_inside = max(self.most_inside, self.inside)
        try:
            time.sleep(self.slow)
            return NodeScores(np.zeros(len(nodes)))
        finally:
            self.inside -= 1


def cluster() -> tuple[ClusterState, TieBreak, object]:
    state = ClusterState([NodeSpec(f"n{i}", 32000, 131072, 4, "V100M16") for i in range(3)])
    return state, TieBreak.by_name(state.names), state.request(PodSpec("p", 1000, 1024, 1, 500))


def test_a_model_that_fails_at_start_stays_reported(tmp_path: Path) -> None:
    """strictModel false: the error vanished from /status at the first poll, two seconds after start."""
    calls = []

    def loader(path, typical):
        calls.append(path)
        raise RuntimeError("corrupt model")

    (tmp_path / "bad.npz").write_text("x")
    engine = PolicyEngine(PolicySettings(model_path=str(tmp_path / "bad.npz")), model_loader=loader)
    engine.start(strict_model=False)
    asyncio.run(engine.poll())
    model = engine.status()["model"]
    assert model["loaded"] is False and model["error"] == "RuntimeError: corrupt model"
    assert len(calls) == 1  # the same bytes are not tried again


def test_an_unreadable_typical_pods_path_in_the_policy_file_does_not_stop_start_up(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"typicalPodsPath: {tmp_path / 'missing.json'}\n")
    engine = PolicyEngine(PolicySettings(), policy_file=str(policy))
    engine.start(strict_model=False)
    assert "missing.json" in (engine.settings_error or "") and engine.typical_source == "built-in"


def test_a_reloaded_model_does_not_wait_for_a_hung_call(tmp_path: Path) -> None:
    """Thread mode: one hung call kept every later decision on the fallback ("busy"), even after a
    fixed model was loaded, until the hung call ended."""
    (tmp_path / "m").write_text("1")
    models = {"1": Model("v1", slow=1.0), "2": Model("v2")}
    settings = PolicySettings(model_path=str(tmp_path / "m"), deadline_ms=20, deadline_enforcement="thread")
    engine = PolicyEngine(settings, model_loader=lambda path, typical: models[Path(path).read_text()])
    engine.start()
    state, tiebreak, req = cluster()

    async def run() -> None:
        first = await engine.decide(state, tiebreak, req, np.arange(3))
        assert first.fallback_reason == "deadline" and engine.status()["policyCallRunningS"] is not None
        (tmp_path / "m").write_text("2")
        await engine.poll()
        after = await engine.decide(state, tiebreak, req, np.arange(3))
        assert after.served_by == "policy" and after.model_version == "v2"
        await asyncio.sleep(1.1)  # the hung call ends: it must not clear anything of the new worker's

    asyncio.run(run())
    engine.close()


def test_bind_does_not_run_the_model_beside_a_running_call(tmp_path: Path) -> None:
    """A reload switched thread → timer while a timed-out call still ran: bind called the model on the
    loop thread at the same time (a model object is not safe to call twice at once)."""
    (tmp_path / "m").write_text("1")
    model = Model(slow=0.5)
    settings = PolicySettings(model_path=str(tmp_path / "m"), deadline_ms=20, deadline_enforcement="thread")
    engine = PolicyEngine(settings, model_loader=lambda path, typical: model)
    engine.start()
    state, tiebreak, req = cluster()

    async def run() -> None:
        assert (await engine.decide(state, tiebreak, req, np.arange(3))).fallback_reason == "deadline"
        engine.settings = replace(engine.settings, deadline_enforcement="timer")
        model.slow = 0.0
        assert engine.cards_on(state, tiebreak, req, 0) == (0,)
        await asyncio.sleep(0.6)

    asyncio.run(run())
    engine.close()
    assert model.most_inside == 1


def test_fragmentation_computed_while_a_pod_is_placed_is_not_stamped_current(monkeypatch) -> None:
    """The kernel releases the GIL: a bind placing a pod while a thread-mode decision computed the rows
    got its new node version stamped on the value computed before it."""
    typical = default_typical()
    state = ClusterState([NodeSpec(f"n{i}", 32000, 131072, 4, "V100M16") for i in range(4)])
    frag = fragmentation.Fragmentation(typical, state.model_names)
    frag.node_frag(state.copy())  # compiled
    real = fragmentation._frag_rows
    computed = threading.Event()

    def slow(*args):
        real(*args)
        if threading.current_thread() is not threading.main_thread():
            computed.set()
            time.sleep(0.2)  # the kernel still running, for other rows

    monkeypatch.setattr(fragmentation, "_frag_rows", slow)
    worker = threading.Thread(target=frag.node_frag, args=(state,))
    worker.start()
    computed.wait(5)
    state.place(state.request(PodSpec("p", 2000, 4096, 1, 500)), 0, (0,))  # meanwhile, a bind
    worker.join()
    monkeypatch.setattr(fragmentation, "_frag_rows", real)
    fresh = state.copy()
    fresh.caches = {}
    assert frag.node_frag(state)[0] == fragmentation.Fragmentation(typical, state.model_names).node_frag(fresh)[0]
