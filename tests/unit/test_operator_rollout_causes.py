"""Why a rollout failed is decided from what the extender reports, not read back out of a message;
and the extender's own model digest never outlives the operator's policy file."""

from __future__ import annotations

import base64
import hashlib
import time
from pathlib import Path

import pytest

from rlsched.extender.policy import PolicyEngine
from rlsched.extender.settings import PolicySettings
from rlsched.operator.extender_client import ExtenderView
from rlsched.operator.rollout import LOST_AFTER_PUBLISH_TRIES, ModelFetcher, Rollout
from rlsched.operator.sink import CURRENT, LAST_GOOD, Bundle, DirectorySink
from rlsched.operator.spec import parse_spec
from rlsched.operator.testing import EngineExtender, FakeKube, fake_model, fake_model_loader

NS = "sched"
PINNED = "a" * 64
"""A digest in the extender's own config, for its own model (``policy.modelSha256``)."""


def _rollout(tmp_path: Path, ext: EngineExtender, kube: FakeKube) -> Rollout:
    clock = {"t": 0.0}

    async def sleep(s: float) -> None:
        clock["t"] += s

    return Rollout(
        DirectorySink(tmp_path / "policy"),
        ext,
        ModelFetcher(kube),
        timeout_s=5.0,
        poll_s=1.0,
        clock=lambda: time.time() + clock["t"],
        sleep=sleep,
        monotonic=lambda: clock["t"],
    )


@pytest.fixture
def setup(tmp_path: Path):
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "policy.yaml").write_text("{}\n")
    kube = FakeKube()
    ext = EngineExtender(str(tmp_path / "policy" / "policy.yaml"))
    rollout = _rollout(tmp_path, ext, kube)
    yield rollout.sink, kube, ext, rollout
    ext.engine.close()


@pytest.fixture
def pinned(tmp_path: Path):
    """An extender whose own config pins a model digest (its base settings)."""
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "policy.yaml").write_text("{}\n")
    kube = FakeKube()
    ext = EngineExtender(str(tmp_path / "policy" / "policy.yaml"))
    ext.engine.close()
    base = PolicySettings(mode="active", fallback="least-allocated", model_sha256=PINNED)
    ext.engine = PolicyEngine(base, str(tmp_path / "policy" / "policy.yaml"), fake_model_loader)
    ext.engine.start(strict_model=False)
    rollout = _rollout(tmp_path, ext, kube)
    yield rollout.sink, kube, ext, rollout
    ext.engine.close()


def spec(**kw) -> dict:
    return {"fallback": "least-allocated", **kw}


def model_cm(kube: FakeKube, name: str, data: bytes) -> None:
    kube.configmaps[(NS, name)] = {"metadata": {"name": name}, "binaryData": {"m.npz": base64.b64encode(data).decode()}}


def cm_spec(name: str, **kw) -> dict:
    return spec(model={"configMapKeyRef": {"name": name, "key": "m.npz"}}, **kw)


# -- the cause of a failure ---------------------------------------------------------------------------


@pytest.mark.parametrize("folder", ["blobs/sha256", "the policy file"])
async def test_a_load_error_is_a_model_failure_whatever_its_path_says(setup, tmp_path: Path, folder: str) -> None:
    """The reason was found by searching the message: a path with "sha256" in it made a corrupt model a
    DigestMismatch (not marked rollbackOf, so an operator restart published it again), one with
    "policy file" a PolicyFileRejected."""
    sink, _, _, rollout = setup
    f = tmp_path / folder / "m.npz"
    f.parent.mkdir(parents=True)
    f.write_bytes(b"truncated garbage")
    result = await rollout.apply(await rollout.build(NS, "p", 7, parse_spec(spec(model={"path": str(f)}))))
    assert not result.ok and result.reason == "ModelLoadFailed", result.message
    assert result.rollback_ok and (await sink.read(CURRENT)).meta.get("rollbackOf") == 7


async def test_a_timeout_is_a_timeout_whatever_the_served_path_says(setup, tmp_path: Path) -> None:
    """The timeout message names the model that serves: one under a "sha256" folder made it DigestMismatch."""
    sink, _, ext, rollout = setup
    f = tmp_path / "blobs" / "sha256" / "m.npz"
    f.parent.mkdir(parents=True)
    f.write_bytes(fake_model("v1"))
    assert (await rollout.apply(await rollout.build(NS, "p", 1, parse_spec(spec(model={"path": str(f)}))))).ok

    async def stuck() -> None:  # the extender no longer reads the published files
        return None

    ext.engine.poll = stuck
    result = await rollout.apply(
        await rollout.build(NS, "p", 2, parse_spec(spec(mode="shadow", model={"path": str(f)})))
    )
    assert not result.ok and result.reason == "RolloutTimeout", result.message
    assert str(f) in result.message and (await sink.read(CURRENT)).meta.get("rollbackOf") is None


async def test_the_extenders_digest_refusal_stays_a_digest_mismatch(setup, tmp_path: Path) -> None:
    """Under a "sha256" folder too; not final (the file may still be on its way): no rollbackOf."""
    sink, _, _, rollout = setup
    f = tmp_path / "sha256" / "m.npz"
    f.parent.mkdir()
    f.write_bytes(fake_model("unreviewed"))
    reviewed = hashlib.sha256(fake_model("v1")).hexdigest()
    b = await rollout.build(NS, "p", 3, parse_spec(spec(model={"path": str(f), "sha256": reviewed})))
    result = await rollout.apply(b)
    assert not result.ok and result.reason == "DigestMismatch", result.message
    assert "sha256 mismatch" in result.message and (await sink.read(CURRENT)).meta.get("rollbackOf") is None


@pytest.mark.parametrize(
    ("answers", "cause"),
    [
        ("a" + "x" * 10, "ExtenderUnreachable"),  # answered once (the old bundle), then restarted
        ("axxa" + "a" * 20, "RolloutTimeout"),  # away for a while, answering at the deadline: a timeout
    ],
)
async def test_an_extender_that_stops_answering_is_unreachable_at_the_deadline(setup, answers, cause) -> None:
    """``a``: an answer (not yet the new bundle), ``x``: no answer. Unreachable at the deadline after
    one answer was a RolloutTimeout: rolled back, although the extender may serve the bundle once it is
    back. The guard: an extender that answers at the deadline without serving the bundle timed out."""
    from rlsched.operator.extender_client import ExtenderUnavailable

    sink, kube, ext, rollout = setup
    model_cm(kube, "m1", fake_model("v1"))
    assert (await rollout.apply(await rollout.build(NS, "p", 1, parse_spec(cm_spec("m1"))))).ok

    async def stuck() -> None:  # the extender does not read the new files (yet)
        return None

    ext.engine.poll = stuck
    real_status, script = ext.status, iter(answers)

    async def scripted():
        if next(script, "x") == "x":
            raise ExtenderUnavailable("GET http://extender/status: ConnectionRefusedError")
        return await real_status()

    ext.status = scripted
    model_cm(kube, "m2", fake_model("v2"))
    bundle = await rollout.build(NS, "p", 2, parse_spec(cm_spec("m2")))
    checked = await rollout.verify(bundle, since=0.0)
    assert checked.cause is not None and checked.cause.value == cause, checked.message
    assert checked.view is not None  # the last answer, for the status


async def _crashing(kube: FakeKube, ext: EngineExtender, rollout: Rollout, answers: str):
    """Generation 1 rolled out; then the extender answers ``answers`` per poll after each publish
    (``a``: an answer, not yet the new bundle; ``x``: none) — a model that crashes it while loading.
    Returns generation 2's bundle."""
    from rlsched.operator.extender_client import ExtenderUnavailable

    model_cm(kube, "m1", fake_model("v1"))
    assert (await rollout.apply(await rollout.build(NS, "p", 1, parse_spec(cm_spec("m1"))))).ok
    real_status, script = ext.status, {"left": iter("")}

    async def scripted():
        current = await rollout.sink.read(CURRENT)
        if current is not None and current.meta.get("generation") != 2:  # the old bundle: serves again
            return await real_status()
        if next(script["left"], "x") == "x":
            raise ExtenderUnavailable("GET http://extender/status: ConnectionRefusedError")
        return ExtenderView.from_status({"policy": ext.engine.status()})  # not re-read yet: the old bundle

    publish = rollout.publish

    async def publish_and_restart(bundle: Bundle) -> float:
        script["left"] = iter(answers)
        return await publish(bundle)

    ext.status = scripted
    rollout.publish = publish_and_restart  # type: ignore[method-assign]
    model_cm(kube, "m2", fake_model("v2"))
    return await rollout.build(NS, "p", 2, parse_spec(cm_spec("m2")), uid="uid-1")


async def test_an_extender_lost_after_publish_three_tries_in_a_row_is_rolled_back(setup) -> None:
    """A model that OOM-kills the extender while loading: it answered (the old bundle), then never
    again. Every try ended ExtenderUnreachable with the bundle left published, and kopf's retry
    published it again, for ever. After LOST_AFTER_PUBLISH_TRIES such tries in a row it is rolled back,
    marked (a restart does not publish it again) with its own reason."""
    sink, kube, ext, rollout = setup
    bundle = await _crashing(kube, ext, rollout, "a")
    first = await rollout.apply(bundle, lost_before=0)
    second = await rollout.apply(bundle, lost_before=first.lost_tries)
    for result, tries in ((first, 1), (second, 2)):
        assert result.reason == "ExtenderUnreachable" and result.rolled_back_to is None, result.message
        assert result.lost_tries == tries and f"try {tries} of {LOST_AFTER_PUBLISH_TRIES}" in result.message
    assert (await sink.read(CURRENT)).meta["generation"] == 2  # stays published until then
    third = await rollout.apply(bundle, lost_before=second.lost_tries)
    assert third.reason == "ExtenderLostAfterPublish" and third.rollback_ok, third.message
    assert "stopped answering after model" in third.message and "on 3 tries" in third.message
    current = await sink.read(CURRENT)
    assert current.meta["generation"] == 1 and ext.engine.model_info.version == "v1"
    assert (current.meta["rollbackOf"], current.meta["rollbackUid"], current.meta["rollbackReason"]) == (
        2,
        "uid-1",
        "ExtenderLostAfterPublish",
    )


async def test_an_extender_silent_since_it_was_lost_goes_on_counting(setup) -> None:
    """The extender loads its model before its status port answers: once the model crashed it, it
    does not answer at all on the next tries (CrashLoopBackOff). Those tries continue the count."""
    sink, kube, ext, rollout = setup
    bundle = await _crashing(kube, ext, rollout, "")
    result = await rollout.apply(bundle, lost_before=LOST_AFTER_PUBLISH_TRIES - 1)
    assert result.reason == "ExtenderLostAfterPublish" and result.rollback_ok, result.message


async def test_an_extender_that_never_answered_is_not_rolled_back_from(setup) -> None:
    """Guard: an extender that never answered since the bundle was published was down before; the
    bundle is not suspect, however many tries."""
    sink, kube, ext, rollout = setup
    bundle = await _crashing(kube, ext, rollout, "")
    for _try in range(2 * LOST_AFTER_PUBLISH_TRIES):
        result = await rollout.apply(bundle, lost_before=0)
        assert result.reason == "ExtenderUnreachable" and result.lost_tries == 0 and result.rolled_back_to is None
        assert "rolled back" not in result.message
    assert (await sink.read(CURRENT)).meta["generation"] == 2


# -- the extender's own digest ------------------------------------------------------------------------


async def test_a_configmap_model_rolls_out_over_an_extender_that_pins_its_own_digest(pinned) -> None:
    """The policy file left modelSha256 out: the extender kept its own config's digest and refused every
    ConfigMap or URL model the operator rolled out."""
    _, kube, ext, rollout = pinned
    model_cm(kube, "m1", fake_model("v1"))
    result = await rollout.apply(await rollout.build(NS, "p", 1, parse_spec(cm_spec("m1"))))
    assert result.ok, result.message
    assert ext.engine.settings.model_sha256 is None and ext.engine.model_info.version == "v1"


async def test_the_no_model_rollback_clears_the_extenders_own_digest(pinned) -> None:
    """The rollback to no model removed modelSha256 from the policy file instead of setting it null."""
    sink, kube, ext, rollout = pinned
    model_cm(kube, "bad", b"not a model")
    result = await rollout.apply(await rollout.build(NS, "p", 1, parse_spec(cm_spec("bad"))))
    assert not result.ok and result.rollback_ok
    assert (await sink.read(CURRENT)).settings["modelSha256"] is None
    assert ext.engine.settings.model_path is None and ext.engine.settings.model_sha256 is None


async def test_a_last_good_bundle_without_a_digest_key_rolls_back_unpinned(pinned, tmp_path: Path) -> None:
    """A last-good bundle written by an older operator has no modelSha256: published as it was, the
    extender's own digest applied to it and refused the model rolled back to."""
    sink, kube, ext, rollout = pinned
    model_cm(kube, "m1", fake_model("v1"))
    good = await rollout.build(NS, "p", 1, parse_spec(cm_spec("m1")))
    old = Bundle({k: v for k, v in good.settings.items() if k != "modelSha256"}, good.model_name, good.model, good.meta)
    await sink.write(LAST_GOOD, old)
    model_cm(kube, "bad", b"not a model")
    result = await rollout.apply(await rollout.build(NS, "p", 2, parse_spec(cm_spec("bad", mode="shadow"))))
    assert not result.ok and result.reason == "ModelLoadFailed"
    assert result.rollback_ok, result.message
    assert ext.engine.model_info.version == "v1" and ext.engine.settings.model_sha256 is None


def test_the_extenders_error_kind_decides_a_digest_refusal_over_its_words() -> None:
    """``model.errorKind`` says what failed; the sentence is read only from an extender without it."""
    from rlsched.operator.extender_client import ExtenderView
    from rlsched.operator.rollout import refused_for_digest
    from rlsched.operator.sink import Bundle

    digest = "a" * 64
    bundle = Bundle(settings={"modelPath": "/m/model.npz"}, meta={"digest": digest})
    sentence = f"sha256 mismatch: /m/model.npz has sha256 {'b' * 64}, modelSha256 expects {digest}; not loaded"

    def view(error: str, kind: str | None, path: str | None = "/m/model.npz") -> ExtenderView:
        return ExtenderView(error=error, error_kind=kind, error_path=path)

    assert refused_for_digest(view("refused: other bytes", "digest"), bundle)  # whatever the words
    assert not refused_for_digest(view(sentence, "load"), bundle)  # the words alone do not make it one
    assert not refused_for_digest(view("refused", "digest", path="/other.npz"), bundle)  # another file's
    assert refused_for_digest(view(sentence, None), bundle)  # an older extender: the sentence, whole
    assert not refused_for_digest(view("ValueError: sha256 of the header", None), bundle)
