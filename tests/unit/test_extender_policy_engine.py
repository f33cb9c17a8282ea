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


# -- modelSha256 and files that failed before --------------------------------------------------------


def _digest(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _engine_with_policy_file(tmp_path: Path, text: str, loads: list[str]) -> PolicyEngine:
    from rlsched.operator.testing import fake_model_loader

    def loader(path, typical):
        loads.append(Path(path).read_bytes())
        return fake_model_loader(path, typical)

    policy = tmp_path / "policy.yaml"
    policy.write_text(text)
    engine = PolicyEngine(PolicySettings(fallback="least-allocated"), str(policy), model_loader=loader)
    engine.start(strict_model=False)
    return engine


def test_a_model_file_whose_sha256_is_not_model_sha256_is_never_loaded(tmp_path: Path) -> None:
    """modelSha256 was not a setting: whatever bytes were at modelPath were loaded and served."""
    from rlsched.operator.testing import fake_model

    good, other = fake_model("v1"), fake_model("unreviewed")
    f = tmp_path / "m.npz"
    f.write_bytes(other)
    loads: list[str] = []
    engine = _engine_with_policy_file(tmp_path, f"modelPath: {f}\nmodelSha256: {_digest(good)}\n", loads)
    try:
        model = engine.status()["model"]
        assert engine.model is None and loads == [] and model["errorPath"] == str(f)
        assert f"has sha256 {_digest(other)}, modelSha256 expects {_digest(good)}" in model["error"]
        assert model["errorKind"] == "digest"  # what the operator's rollout reads, not the sentence
        f.write_bytes(good)  # the reviewed bytes arrive
        asyncio.run(engine.poll())
        model = engine.status()["model"]
        assert engine.model_info.version == "v1" and loads == [good] and model["error"] is model["errorKind"] is None
        f.write_bytes(other)  # replaced after the rollout: refused, the loaded model keeps serving
        asyncio.run(engine.poll())
        asyncio.run(engine.poll())
        assert engine.model_info.version == "v1" and loads == [good]
        model = engine.status()["model"]
        assert model["errorPath"] == str(f) and model["fileDigest"] == _digest(good)
        assert model["errorKind"] == "digest"
    finally:
        engine.close()


def test_a_broken_model_file_is_a_load_error_in_status(tmp_path: Path) -> None:
    f = tmp_path / "m.npz"
    f.write_bytes(b"not a model at all")
    engine = _engine_with_policy_file(tmp_path, f"modelPath: {f}\n", [])
    try:
        model = engine.status()["model"]
        assert engine.model is None and model["errorKind"] == "load" and model["errorPath"] == str(f)
    finally:
        engine.close()


def test_a_new_model_sha256_for_the_unchanged_serving_file_is_checked_when_the_file_changes(tmp_path: Path) -> None:
    """The digest may name bytes still on their way to the path: the serving model stays (no error, its
    fileDigest in /status), and the file is checked against the new digest when it changes."""
    from rlsched.operator.testing import fake_model

    f = tmp_path / "m.npz"
    v1, v2 = fake_model("v1"), fake_model("v2-named")  # sizes differ: a rewrite is seen within a clock tick
    f.write_bytes(v1)
    loads: list[str] = []
    engine = _engine_with_policy_file(tmp_path, f"modelPath: {f}\nmodelSha256: {_digest(v1)}\n", loads)
    try:
        policy = Path(engine.policy_file or "")
        policy.write_text(f"modelPath: {f}\nmodelSha256: {_digest(v2)}\nmode: shadow\n")
        asyncio.run(engine.poll())
        model = engine.status()["model"]
        assert model["version"] == "v1" and model["fileDigest"] == _digest(v1) and model["error"] is None
        f.write_bytes(fake_model("v3-unnamed"))  # not the bytes named: refused
        asyncio.run(engine.poll())
        assert engine.model_info.version == "v1" and "modelSha256 expects " + _digest(v2) in model_error(engine)
        f.write_bytes(v2)
        asyncio.run(engine.poll())
        assert engine.model_info.version == "v2-named" and engine.status()["model"]["error"] is None
        assert loads == [v1, v2]
    finally:
        engine.close()


def model_error(engine: PolicyEngine) -> str:
    return str(engine.status()["model"]["error"])


def test_model_sha256_must_be_a_digest(tmp_path: Path) -> None:
    from rlsched.extender.settings import ConfigError, load_policy_file

    policy = tmp_path / "policy.yaml"
    for bad in ("ABC", "A" * 64, "0" * 63, "g" * 64):
        policy.write_text(f"modelSha256: {bad}\n")
        try:
            load_policy_file(policy, PolicySettings())
        except ConfigError as exc:
            assert "modelSha256: expected 64 lowercase hex digits" in str(exc)
        else:
            raise AssertionError(f"{bad!r} accepted")
    policy.write_text(f"modelSha256: '{'0' * 64}'\n")  # quoted: unquoted digits are a YAML number
    assert load_policy_file(policy, PolicySettings()).model_sha256 == "0" * 64


def test_a_file_that_failed_before_is_reported_again_when_the_policy_file_names_it_again(tmp_path: Path) -> None:
    """A rollback cleared the error; the next policy file naming the same unchanged file was skipped with
    no error at all, so whoever published it waited for a load that never came."""
    from rlsched.operator.testing import fake_model

    good, bad = tmp_path / "good.npz", tmp_path / "bad.npz"
    good.write_bytes(fake_model("v1"))
    bad.write_bytes(b"\x00 not a model")
    loads: list[str] = []
    clock = {"t": 100.0}
    engine = _engine_with_policy_file(tmp_path, f"modelPath: {good}\n", loads)
    engine.clock = lambda: clock["t"]
    policy = Path(engine.policy_file or "")
    try:
        policy.write_text(f"modelPath: {bad}\n")
        asyncio.run(engine.poll())
        assert engine.status()["model"]["errorPath"] == str(bad) and len(loads) == 2
        policy.write_text(f"modelPath: {good}\n")  # the rollback
        asyncio.run(engine.poll())
        assert engine.status()["model"]["error"] is None
        clock["t"] = 200.0
        policy.write_text(f"modelPath: {bad}\nmode: shadow\n")  # the same file again
        asyncio.run(engine.poll())
        model = engine.status()["model"]
        assert model["errorPath"] == str(bad) and model["errorAt"] == 200.0 and "not a model file" in model["error"]
        assert len(loads) == 2 and engine.model_info.version == "v1"  # not loaded again
        clock["t"] = 300.0
        asyncio.run(engine.poll())
        assert engine.status()["model"]["errorAt"] == 200.0  # once per policy file naming it
    finally:
        engine.close()
