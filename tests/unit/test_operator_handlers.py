"""The kopf handlers called directly (no API server): status, conditions, events, errors to kopf."""

from __future__ import annotations

import base64
from pathlib import Path

import kopf
import pytest

from rlsched.operator import handlers
from rlsched.operator.decisionlog import Drainer
from rlsched.operator.requeue import Rejections, Requeuer
from rlsched.operator.rollout import ModelFetcher, Rollout
from rlsched.operator.runtime import Runtime
from rlsched.operator.settings import OperatorSettings, load_settings
from rlsched.operator.sink import CURRENT, DirectorySink, SinkError
from rlsched.operator.testing import EngineExtender, FakeKube, fake_model


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    events: list[tuple[str, str, str]] = []
    monkeypatch.setattr(kopf, "info", lambda body, reason, message: events.append(("Normal", reason, message)))
    monkeypatch.setattr(kopf, "warn", lambda body, reason, message: events.append(("Warning", reason, message)))
    d = tmp_path / "policy"
    d.mkdir()
    (d / "policy.yaml").write_text("{}\n")
    settings = load_settings(None, {"sink.kind": "directory", "sink.directory": str(d), "policy.namespace": "sched"})
    kube = FakeKube()
    ext = EngineExtender(str(d / "policy.yaml"))
    sink = DirectorySink(d)
    rollout = Rollout(sink, ext, ModelFetcher(kube), timeout_s=1.0, poll_s=0.01)
    rt = Runtime(
        settings=settings,
        kube=kube,
        sink=sink,
        extender=ext,
        rollout=rollout,
        requeuer=Requeuer(settings.requeue, lambda uid: None, list, kube.patch_pod_annotations, kube.post_event),
        rejections=Rejections(kube.patch_pod_annotations, kube.post_event),
        drainer=Drainer(ext, None),
    )
    memo = kopf.Memo(settings=settings, kube=kube, runtime=rt)
    yield memo, kube, ext, events
    ext.engine.close()


def body(spec: dict, generation: int = 1, status: dict | None = None) -> dict:
    return {
        "apiVersion": "rlsched.io/v1alpha1",
        "kind": "SchedulingPolicy",
        "metadata": {"name": "default", "namespace": "sched", "uid": "uid-1", "generation": generation},
        "spec": spec,
        "status": status or {},
    }


async def call(fn, b: dict, memo: kopf.Memo, reason: str = "create", patch: kopf.Patch | None = None) -> kopf.Patch:
    """``fn`` as kopf calls it; ``patch`` collects what it wrote even when it raises."""
    patch = kopf.Patch() if patch is None else patch
    await fn(
        body=b,
        spec=b["spec"],
        meta=b["metadata"],
        status=b["status"],
        namespace="sched",
        name="default",
        uid="uid-1",
        patch=patch,
        memo=memo,
        reason=kopf.Reason(reason),
    )
    return patch


def cond(patch: kopf.Patch, type_: str) -> dict:
    return next(c for c in patch.status["conditions"] if c["type"] == type_)


def add_model(kube: FakeKube, name: str, data: bytes) -> None:
    kube.configmaps[("sched", name)] = {
        "metadata": {"name": name},
        "binaryData": {"m.npz": base64.b64encode(data).decode()},
    }


async def test_create_rolls_out_and_reports(env) -> None:
    memo, kube, ext, events = env
    add_model(kube, "models", fake_model("v7"))
    spec = {
        "mode": "shadow",
        "fallback": "least-allocated",
        "model": {"configMapKeyRef": {"name": "models", "key": "m.npz"}},
    }
    patch = await call(handlers.reconcile, body(spec), memo)
    assert cond(patch, "Ready")["status"] == "True" and cond(patch, "Degraded")["status"] == "False"
    assert patch.status["observedGeneration"] == 1
    assert patch.status["model"]["version"] == "v7" and patch.status["lastGood"]["generation"] == 1
    assert patch.status["counts"]["decisions"] == 0 and patch.status["extender"]["mode"] == "shadow"
    assert [e[1] for e in events] == ["RollingOut", "RolledOut"]
    assert memo.runtime.runs[("uid-1", 1, "create")] == 1


async def test_invalid_spec_is_permanent_and_says_what_to_fix(env) -> None:
    memo, _, _, events = env
    with pytest.raises(kopf.PermanentError):
        patch = kopf.Patch()
        b = body({"mode": "sometimes", "model": {"path": "/a", "url": "http://b/c"}})
        try:
            await handlers.reconcile(
                body=b,
                spec=b["spec"],
                meta=b["metadata"],
                status={},
                namespace="sched",
                name="default",
                uid="uid-1",
                patch=patch,
                memo=memo,
                reason=kopf.Reason.CREATE,
            )
        finally:
            d = cond(patch, "Degraded")
            assert d["status"] == "True" and d["reason"] == "InvalidSpec"
            assert "spec.mode: 'sometimes'" in d["message"] and "exactly one of spec.model" in d["message"]
    assert events[-1][:2] == ("Warning", "InvalidSpec")


async def test_model_that_fails_to_load_rolls_back_and_degrades(env) -> None:
    memo, kube, ext, events = env
    add_model(kube, "good", fake_model("v1"))
    add_model(kube, "bad", b"truncated")
    await call(
        handlers.reconcile,
        body({"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "good", "key": "m.npz"}}}),
        memo,
    )
    b2 = body(
        {"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "bad", "key": "m.npz"}}}, generation=2
    )
    patch = kopf.Patch()
    with pytest.raises(kopf.PermanentError):
        await handlers.reconcile(
            body=b2,
            spec=b2["spec"],
            meta=b2["metadata"],
            status={},
            namespace="sched",
            name="default",
            uid="uid-1",
            patch=patch,
            memo=memo,
            reason=kopf.Reason.UPDATE,
        )
    d = cond(patch, "Degraded")
    assert (
        d["status"] == "True"
        and d["reason"] == "ModelLoadFailed"
        and "rolled back to model v1 (generation 1)" in d["message"]
    )
    assert cond(patch, "Ready")["status"] == "False"
    assert patch.status["model"]["version"] == "v1" and patch.status["lastGood"]["generation"] == 1
    assert events[-1][:2] == ("Warning", "RolledBack")
    assert ext.engine.model_info.version == "v1"


async def test_missing_model_configmap_is_temporary(env) -> None:
    memo, _, _, events = env
    with pytest.raises(kopf.TemporaryError):
        await call(handlers.reconcile, body({"model": {"configMapKeyRef": {"name": "later", "key": "m.npz"}}}), memo)
    assert events[-1][1] == "ModelSourceNotFound"


async def test_resume_does_not_roll_out_again(env) -> None:
    memo, kube, ext, events = env
    add_model(kube, "models", fake_model("v1"))
    spec = {"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "models", "key": "m.npz"}}}
    await call(handlers.reconcile, body(spec), memo)
    events.clear()
    patch = await call(handlers.reconcile, body(spec), memo, reason="resume")
    assert events == [] and cond(patch, "Ready")["status"] == "True"


@pytest.mark.parametrize("source", ["deleted", "new bytes"])
async def test_resume_does_not_fetch_the_model_again(env, source: str) -> None:
    """On a restart the model was fetched again before anything was compared: a deleted source made
    the policy not Ready (retried forever), and new bytes under the same key rolled out unreviewed."""
    memo, kube, ext, events = env
    add_model(kube, "models", fake_model("v1"))
    spec = {"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "models", "key": "m.npz"}}}
    await call(handlers.reconcile, body(spec), memo)
    if source == "deleted":
        del kube.configmaps[("sched", "models")]
    else:
        add_model(kube, "models", fake_model("v2-unreviewed"))
    events.clear()
    patch = await call(handlers.reconcile, body(spec), memo, reason="resume")
    assert events == [] and cond(patch, "Ready")["status"] == "True"
    assert ext.engine.model_info.version == "v1"


async def test_unreachable_extender_retries(env) -> None:
    memo, _, ext, events = env
    ext.reachable = False
    with pytest.raises(kopf.TemporaryError):
        await call(handlers.reconcile, body({"mode": "off", "fallback": "least-allocated"}), memo)
    assert events[-1][1] == "ExtenderUnreachable"


async def test_refresh_reports_counts_drift_and_recovery(env) -> None:
    memo, kube, ext, events = env
    add_model(kube, "models", fake_model("v1"))
    first = await call(
        handlers.reconcile,
        body({"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "models", "key": "m.npz"}}}),
        memo,
    )
    status = {"conditions": first.status["conditions"], "observedGeneration": 1}
    ext.engine.counters["decisions"] = 42
    p = await call(handlers.refresh, body({}, status=status), memo)
    assert p["status"]["counts"]["decisions"] == 42 and "conditions" not in p["status"]
    import dataclasses

    ext.engine.settings = dataclasses.replace(ext.engine.settings, mode="off")  # restarted with other settings
    p = await call(handlers.refresh, body({}, status=status), memo)
    assert cond(p, "Degraded")["reason"] == "Drift" and events[-1][1] == "Drift"
    status = {"conditions": p.status["conditions"], "observedGeneration": 1}
    ext.engine._file_key = None  # the next poll re-reads the published policy file
    p = await call(handlers.refresh, body({}, status=status), memo)
    assert cond(p, "Ready")["status"] == "True" and events[-1][1] == "Recovered"


async def test_refresh_reports_drift_when_the_extender_comes_back_from_an_outage_without_the_policy(env) -> None:
    import dataclasses

    memo, kube, ext, events = env
    add_model(kube, "models", fake_model("v1"))
    spec = {"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "models", "key": "m.npz"}}}
    first = await call(handlers.reconcile, body(spec), memo)
    status = {"conditions": first.status["conditions"], "observedGeneration": 1, "lastGood": first.status["lastGood"]}
    ext.reachable = False  # the extender restarts ...
    p = await call(handlers.refresh, body(spec, status=status), memo)
    assert cond(p, "Degraded")["reason"] == "ExtenderUnreachable"
    status["conditions"] = p.status["conditions"]
    ext.reachable = True  # ... and comes back with other settings
    ext.engine.settings = dataclasses.replace(ext.engine.settings, mode="off")
    p = await call(handlers.refresh, body(spec, status=status), memo)
    assert cond(p, "Degraded")["reason"] == "Drift" and events[-1][1] == "Drift"


async def test_refresh_leaves_a_retrying_rollouts_outage_to_the_rollout(env) -> None:
    import dataclasses

    memo, kube, ext, events = env
    add_model(kube, "models", fake_model("v1"))
    spec = {"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "models", "key": "m.npz"}}}
    ext.reachable = False
    failed = kopf.Patch()
    with pytest.raises(kopf.TemporaryError):
        await call(handlers.reconcile, body(spec), memo, patch=failed)
    status = {"conditions": failed.status["conditions"], "observedGeneration": 1}
    ext.reachable = True
    await ext.status()  # it reads the published files ...
    ext.engine.settings = dataclasses.replace(ext.engine.settings, mode="off")  # ... and serves something else
    events.clear()
    p = await call(handlers.refresh, body(spec, status=status), memo)
    assert "conditions" not in p.status and events == []  # no Drift flashes before the retry


async def test_delete_returns_the_extender_to_its_own_settings(env) -> None:
    memo, _, ext, events = env
    await call(handlers.reconcile, body({"mode": "shadow", "fallback": "least-allocated"}), memo)
    await handlers.retire(body=body({}), namespace="sched", name="default", uid="uid-1", memo=memo)
    await ext.status()
    assert ext.engine.settings.mode == "active" and events[-1][1] == "Retired"


async def test_other_policies_are_marked_not_served(env) -> None:
    memo, _, _, events = env
    patch = await call(handlers.not_served, body({}), memo)
    r = cond(patch, "Ready")
    assert r["reason"] == "NotServed" and "sched/default" in r["message"]


def test_registry_and_kopf_settings() -> None:
    s = OperatorSettings()
    assert isinstance(handlers.build_registry(s), kopf.OperatorRegistry)
    ks = kopf.OperatorSettings()
    handlers.configure_kopf(ks, s)
    assert isinstance(ks.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    assert ks.watching.field_selectors[handlers.PODS] == "spec.schedulerName=rl-scheduler"
    assert 590 <= sum(ks.networking.error_backoffs) <= 600
    assert handlers.retry_backoffs(10) == [1, 1, 2, 3] and handlers.retry_backoffs(0.5) == [1.0]


async def test_probe_reports_and_fails_on_dead_tasks(env) -> None:
    import asyncio

    memo, _, _, _ = env
    answer = handlers.probe(memo=memo)
    assert answer["requeued"] == 0 and answer["drainFailing"] is False
    memo.runtime.drainer.last_error = "GET http://rl-scheduler.sched.svc:8889/decisions: HTTP 401"
    answer = handlers.probe(memo=memo)
    assert answer["drainFailing"] is True and "rl-scheduler.sched.svc" not in str(answer)  # open endpoint
    memo.runtime.drainer.last_error = None
    task = asyncio.get_running_loop().create_future()
    task.set_result(None)
    memo.runtime.tasks["drain"] = task
    with pytest.raises(kopf.PermanentError, match="background task drain stopped"):
        handlers.probe(memo=memo)
    memo.runtime.tasks.clear()


async def test_an_unreadable_served_slot_neither_stops_resume_nor_refresh(env, monkeypatch) -> None:
    """The served slot cannot be read (an API error): on a refresh tick nothing is concluded (the next
    tick tries again); on resume the bundle is published again and rolled out as for a changed spec."""
    memo, kube, ext, events = env
    add_model(kube, "models", fake_model("v1"))
    spec = {"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "models", "key": "m.npz"}}}
    first = await call(handlers.reconcile, body(spec), memo)
    sink = memo.runtime.sink
    real_read = sink.read

    async def current_unreadable(slot: str):
        if slot == CURRENT:
            raise SinkError(f"cannot read {slot}: HTTP 503")
        return await real_read(slot)

    monkeypatch.setattr(sink, "read", current_unreadable)
    status = {"conditions": first.status["conditions"], "observedGeneration": 1}
    p = await call(handlers.refresh, body({}, status=status), memo)
    assert "conditions" not in p["status"]
    events.clear()
    patch = await call(handlers.reconcile, body(spec), memo, reason="resume")
    assert cond(patch, "Ready")["status"] == "True" and [e[1] for e in events] == ["RollingOut", "RolledOut"]


@pytest.mark.parametrize("loaded_at", [1e12 * 1000, 1e300, -1e20])
def test_a_load_time_that_is_not_a_time_is_left_out(loaded_at: float) -> None:
    assert handlers._iso(loaded_at) is None
    assert handlers._iso(1_800_000_000.0) is not None
