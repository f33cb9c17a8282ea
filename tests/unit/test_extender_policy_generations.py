"""One policy file generation in effect: a policy file naming another model takes effect together with
that model, never before it (``PolicyEngine``'s docstring).

The extender applied a new policy file's settings at once and loaded its model afterwards: generation 1
``shadow`` with model A, generation 2 ``active`` with model B made A — approved for shadow only — place
pods while B loaded, and for good when B failed to load (until the operator's rollback arrived)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from rlsched.extender.policy import Outcome, PolicyEngine
from rlsched.extender.settings import PolicySettings
from rlsched.operator.extender_client import ExtenderView
from rlsched.operator.rollout import load_failed, serves
from rlsched.operator.sink import Bundle
from rlsched.operator.testing import fake_model, fake_model_loader
from rlsched.policy.cluster import ClusterState, NodeSpec, PodSpec
from rlsched.policy.scorers import TieBreak


class Files:
    """The policy file and model files in ``tmp_path``; every write moves the mtime on (a rewrite of
    the same size within one clock tick is still seen)."""

    def __init__(self, tmp_path: Path):
        self.dir, self.policy, self.tick = tmp_path, tmp_path / "policy.yaml", 0

    def model(self, name: str, data: bytes) -> str:
        path = self.dir / name
        path.write_bytes(data)
        self._bump(path)
        return str(path)

    def write(self, **settings: Any) -> None:
        self.policy.write_text(yaml.safe_dump({"fallback": "least-allocated", **settings}))
        self._bump(self.policy)

    def _bump(self, path: Path) -> None:
        self.tick += 1
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + self.tick * 1_000_000_000))


class GatedLoader:
    """``fake_model_loader`` that holds the load of the files in ``gated`` until ``release`` is set."""

    def __init__(self) -> None:
        self.gated: set[str] = set()
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self, path: str, typical: Any) -> Any:
        if path in self.gated:
            self.entered.set()
            assert self.release.wait(10), "the test never released the load"
        return fake_model_loader(path, typical)


def engine(files: Files, loader: Any = fake_model_loader) -> PolicyEngine:
    e = PolicyEngine(PolicySettings(mode="active", fallback="least-allocated"), str(files.policy), loader)
    e.start(strict_model=False)
    return e


async def decide(e: PolicyEngine) -> Outcome:
    state = ClusterState([NodeSpec("n1", 32000, 131072, 4, "T4"), NodeSpec("n2", 16000, 65536)])
    return await e.decide(state, TieBreak.by_name(state.names), state.request(PodSpec("p", 1000, 1024)), np.arange(2))


async def while_loading(e: PolicyEngine, loader: GatedLoader) -> asyncio.Task[None]:
    """Starts a poll and returns once it is inside the gated load (the event loop free meanwhile)."""
    poll = asyncio.create_task(e.poll())
    while not loader.entered.is_set():
        await asyncio.sleep(0.01)
    return poll


def view(e: PolicyEngine) -> ExtenderView:
    return ExtenderView.from_status({"policy": e.status()})


def bundle(**settings: Any) -> Bundle:
    return Bundle({"fallback": "least-allocated", **settings}, None, None, {})


def test_a_shadow_model_never_places_pods_when_active_names_a_model_that_fails(tmp_path: Path) -> None:
    files = Files(tmp_path)
    a, b = files.model("A.npz", fake_model("A-shadow-only")), files.model("B.npz", b"garbage: not a model")
    files.write(mode="shadow", modelPath=a)
    e = engine(files)

    async def run() -> None:
        assert (await decide(e)).fallback_reason == "mode-shadow"
        files.write(mode="active", modelPath=b)
        for _ in range(3):  # B failed; later polls change nothing
            await e.poll()
            out = await decide(e)
            assert (out.served_by, out.fallback_reason) == ("fallback", "mode-shadow"), out
        st = e.status()
        assert st["mode"] == "shadow" and st["model"]["path"] == a and st["model"]["version"] == "A-shadow-only"
        assert st["model"]["errorPath"] == b and "not a model file" in st["model"]["error"]
        pending = st["pending"]
        assert pending["mode"] == "active" and pending["modelPath"] == b and pending["state"] == "failed"
        assert "not a model file" in pending["error"]
        # The operator's check: generation 2 is not served and failed; generation 1 is what serves.
        assert not serves(view(e), bundle(mode="active", modelPath=b))
        assert load_failed(view(e), bundle(mode="active", modelPath=b), since=0.0)
        assert serves(view(e), bundle(mode="shadow", modelPath=a))
        # The operator's rollback (generation 1 again): in effect at once, nothing pending, no error.
        files.write(mode="shadow", modelPath=a)
        await e.poll()
        st = e.status()
        assert st["pending"] is None and st["model"]["error"] is None and st["mode"] == "shadow"
        # B fixed and named again: active with B.
        files.model("B.npz", fake_model("B-good"))
        files.write(mode="active", modelPath=b)
        await e.poll()
        out = await decide(e)
        assert (out.served_by, out.model_version) == ("policy", "B-good") and e.status()["pending"] is None

    try:
        asyncio.run(run())
    finally:
        e.close()


def test_a_shadow_model_does_not_place_pods_while_the_active_model_loads(tmp_path: Path) -> None:
    files = Files(tmp_path)
    loader = GatedLoader()
    a, c = files.model("A.npz", fake_model("A-shadow-only")), files.model("C.npz", fake_model("C-good"))
    files.write(mode="shadow", modelPath=a)
    e = engine(files, loader)

    async def run() -> None:
        loader.gated.add(c)
        files.write(mode="active", modelPath=c, fallback="bestfit")
        poll = await while_loading(e, loader)
        try:
            out = await decide(e)
            assert (out.served_by, out.fallback_reason, out.model_version) == (
                "fallback",
                "mode-shadow",
                "A-shadow-only",
            )
            assert out.scorer == "least-allocated"  # the fallback of generation 1 too
            st = e.status()
            assert (st["mode"], st["fallback"], st["model"]["path"]) == ("shadow", "least-allocated", a)
            assert st["pending"]["state"] == "loading" and st["pending"]["modelPath"] == c
            assert not serves(view(e), bundle(mode="active", fallback="bestfit", modelPath=c))
        finally:
            loader.release.set()
            await poll
        out = await decide(e)
        assert (out.served_by, out.model_version) == ("policy", "C-good")
        st = e.status()
        assert (st["mode"], st["fallback"], st["model"]["path"], st["pending"]) == ("active", "bestfit", c, None)

    try:
        asyncio.run(run())
    finally:
        e.close()


def test_an_active_model_keeps_serving_actively_until_the_next_shadow_model_has_loaded(tmp_path: Path) -> None:
    """The reverse: active A → (shadow, B). A was approved active by generation 1 and keeps serving
    under it while B loads (and if B fails); B shadows once loaded. Before, the new mode applied first,
    so generation 2's shadow mode ran with generation 1's model."""
    files = Files(tmp_path)
    loader = GatedLoader()
    a, b = files.model("A.npz", fake_model("A")), files.model("B.npz", fake_model("B"))
    files.write(mode="active", modelPath=a)
    e = engine(files, loader)

    async def run() -> None:
        loader.gated.add(b)
        files.write(mode="shadow", modelPath=b)
        poll = await while_loading(e, loader)
        try:
            out = await decide(e)
            assert (out.served_by, out.model_version) == ("policy", "A")
            assert e.status()["mode"] == "active" and e.status()["pending"]["mode"] == "shadow"
        finally:
            loader.release.set()
            await poll
        out = await decide(e)
        assert (out.served_by, out.fallback_reason, out.model_version) == ("fallback", "mode-shadow", "B")

    try:
        asyncio.run(run())
    finally:
        e.close()


def test_a_new_digest_for_the_unchanged_serving_file_changes_nothing_until_its_bytes_arrive(tmp_path: Path) -> None:
    """A ``path`` model: generation 1 shadow with bytes v1, generation 2 active naming bytes v2 at the same
    path, not copied in yet. The v1 bytes (approved for shadow) were served actively meanwhile."""
    files = Files(tmp_path)
    v1, v2 = fake_model("v1"), fake_model("v2-named")
    p = files.model("m.npz", v1)
    files.write(mode="shadow", modelPath=p, modelSha256=hashlib.sha256(v1).hexdigest())
    e = engine(files)

    async def run() -> None:
        files.write(mode="active", modelPath=p, modelSha256=hashlib.sha256(v2).hexdigest())
        await e.poll()
        out = await decide(e)
        assert (out.fallback_reason, out.model_version) == ("mode-shadow", "v1")
        st = e.status()
        assert st["mode"] == "shadow" and st["model"]["error"] is None and st["pending"]["state"] == "waiting"
        files.model("m.npz", v2)
        await e.poll()
        out = await decide(e)
        assert (out.served_by, out.model_version) == ("policy", "v2-named") and e.status()["pending"] is None

    try:
        asyncio.run(run())
    finally:
        e.close()


def test_a_file_without_a_model_or_with_the_serving_model_takes_effect_at_once(tmp_path: Path) -> None:
    """Only a file naming another model waits: a mode change for the model in effect, or no model (the
    operator's rollback with no last-good), applies at the next poll."""
    files = Files(tmp_path)
    a = files.model("A.npz", fake_model("A"))
    files.write(mode="shadow", modelPath=a)
    e = engine(files)

    async def run() -> None:
        files.write(mode="active", modelPath=a)
        await e.poll()
        assert (await decide(e)).served_by == "policy" and e.status()["pending"] is None
        files.write(mode="active")
        await e.poll()
        out = await decide(e)
        assert (out.fallback_reason, e.status()["model"]["loaded"], e.status()["pending"]) == ("no-model", False, None)

    try:
        asyncio.run(run())
    finally:
        e.close()


def test_with_no_model_in_effect_a_new_files_settings_apply_even_when_its_model_fails(tmp_path: Path) -> None:
    """No model loaded (the one named at start is broken): a file that changes only the fallback, or
    names another broken model, mixes no generations — there is no model to mix with. Its settings were
    held back as pending until the model's bytes changed."""
    files = Files(tmp_path)
    broken = files.model("m.npz", b"garbage, not a model")
    files.write(mode="active", modelPath=broken)
    engine = PolicyEngine(
        PolicySettings(mode="active", fallback="least-allocated"), str(files.policy), fake_model_loader
    )
    engine.start(strict_model=False)
    assert engine.model is None and engine.fallback_scorer.name == "least-allocated"

    files.write(mode="active", fallback="fgd", modelPath=broken)  # the same failed bytes
    asyncio.run(engine.poll())
    assert engine.settings.fallback == "fgd" and engine.fallback_scorer.name == "fgd" and engine.pending is None

    other = files.model("other.npz", b"also garbage")
    files.write(mode="shadow", fallback="most-allocated", modelPath=other)  # a new file that fails to load
    asyncio.run(engine.poll())
    assert engine.model is None and engine.pending is None
    assert (engine.settings.mode, engine.fallback_scorer.name) == ("shadow", "most-allocated")
    assert engine.model_info.error and engine.model_info.error_path == other
