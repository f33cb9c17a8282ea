"""Edges of the rollback that the main tests leave open: a failed bundle that the last-good slot also
holds is not published again as the rollback, and a rollback that is not confirmed leaves the
last-good slot alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_operator_rollout_causes import NS, _rollout, cm_spec, model_cm

from rlsched.operator.rollout import Cause, Verification
from rlsched.operator.sink import CURRENT, LAST_GOOD, Bundle
from rlsched.operator.spec import parse_spec
from rlsched.operator.testing import EngineExtender, FakeKube, fake_model


@pytest.fixture
def parts(tmp_path: Path):
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "policy.yaml").write_text("{}\n")
    kube = FakeKube()
    ext = EngineExtender(str(tmp_path / "policy" / "policy.yaml"))
    rollout = _rollout(tmp_path, ext, kube)
    yield rollout.sink, kube, ext, rollout
    ext.engine.close()


async def test_a_failed_bundle_that_the_last_good_slot_holds_is_not_published_again(parts) -> None:
    """The last-good slot holds the very bytes that failed now (they rolled out once): rolling back to
    it would publish the failed model again; the rollback is to no model."""
    sink, kube, ext, rollout = parts
    model_cm(kube, "bad", b"not a model")
    bad = await rollout.build(NS, "p", 1, parse_spec(cm_spec("bad")), uid="uid-1")
    await sink.write(LAST_GOOD, bad)
    result = await rollout.apply(bad)
    assert result.reason == "ModelLoadFailed", result.message
    assert result.rolled_back_to is not None and result.rolled_back_to.settings["modelPath"] is None
    current = await sink.read(CURRENT)
    assert current.settings["modelPath"] is None and current.model_name is None
    assert "rolled back to no model" in result.message


async def test_a_rollback_that_is_not_confirmed_does_not_write_the_last_good_slot(parts) -> None:
    sink, kube, ext, rollout = parts
    model_cm(kube, "m1", fake_model("v1"))
    assert (await rollout.apply(await rollout.build(NS, "p", 1, parse_spec(cm_spec("m1"))))).ok
    verify, checks = rollout.verify, []

    async def rollback_unconfirmed(bundle: Bundle, since: float, timeout_s=None, before=None) -> Verification:  # noqa: ANN001
        checks.append(bundle)
        if len(checks) == 2:  # the rollback's own verification: the extender went away meanwhile
            return Verification(Cause.UNREACHABLE, None, "the extender's status port did not answer")
        return await verify(bundle, since, timeout_s, before)

    write, slots = sink.write, []

    async def spy(slot: str, bundle: Bundle) -> None:
        slots.append(slot)
        await write(slot, bundle)

    rollout.verify = rollback_unconfirmed  # type: ignore[method-assign]
    sink.write = spy  # type: ignore[method-assign]
    model_cm(kube, "bad", b"not a model")
    result = await rollout.apply(await rollout.build(NS, "p", 2, parse_spec(cm_spec("bad"))))
    assert result.reason == "ModelLoadFailed" and result.rollback_ok is False, result.message
    assert LAST_GOOD not in slots and slots == [CURRENT, CURRENT]
