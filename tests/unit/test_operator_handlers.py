"""The kopf handlers called directly (no API server): status, conditions, events, errors to kopf."""

from __future__ import annotations

import base64
import logging
from pathlib import Path

import kopf
import pytest

from rlsched.operator import handlers
from rlsched.operator.decisionlog import Drainer, OutcomeTracker
from rlsched.operator.extender_client import ExtenderView
from rlsched.operator.requeue import Rejections, Requeuer
from rlsched.operator.rollout import LOST_AFTER_PUBLISH_TRIES, ModelFetcher, Rollout
from rlsched.operator.runtime import Runtime
from rlsched.operator.settings import OperatorSettings, load_settings
from rlsched.operator.sink import CURRENT, DirectorySink, SinkError
from rlsched.operator.spec import parse_spec
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


async def call(
    fn,
    b: dict,
    memo: kopf.Memo,
    reason: str = "create",
    patch: kopf.Patch | None = None,
    retry: int | None = None,
) -> kopf.Patch:
    """``fn`` as kopf calls it (``retry``: kopf's count of earlier tries, passed when given); ``patch``
    collects what it wrote even when it raises."""
    patch = kopf.Patch() if patch is None else patch
    await fn(
        body=b,
        spec=b["spec"],
        meta=b["metadata"],
        status=b["status"],
        namespace="sched",
        name="default",
        uid=b["metadata"]["uid"],
        patch=patch,
        memo=memo,
        reason=kopf.Reason(reason),
        **({} if retry is None else {"retry": retry}),
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
    spec["mode"] = "active"
    await call(handlers.reconcile, body(spec, generation=2), memo, reason="update")
    assert dict(memo.runtime.runs) == {("uid-1", 2, "update"): 1}  # earlier generations are let go


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


# -- path digests, rollbacks across restarts, overlapping timers -----------------------------------


def sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def status_after(*patches: kopf.Patch) -> dict:
    out: dict = {}
    for p in patches:
        out.update(p.status)
    return out


async def test_a_path_models_sha256_is_enforced_by_the_extender(env, tmp_path: Path) -> None:
    """spec.model.sha256 of a path model was checked only by the operator, after the fact: the extender
    served other bytes until the rollback, hot-reloaded a replaced file unchecked, and refresh saw no Drift."""
    memo, _, ext, events = env
    f = tmp_path / "m.npz"
    v1, unreviewed = fake_model("v1"), fake_model("unreviewed")
    spec = {"fallback": "least-allocated", "model": {"path": str(f), "sha256": sha(v1)}}
    loaded: list[str] = []
    loader = ext.engine.model_loader
    ext.engine.model_loader = lambda path, typical: (loaded.append(Path(path).read_bytes()), loader(path, typical))[1]

    # other bytes at the path: never loaded, and the rollout says why
    f.write_bytes(unreviewed)
    failed = kopf.Patch()
    with pytest.raises(kopf.PermanentError):
        await call(handlers.reconcile, body(spec), memo, patch=failed)
    assert cond(failed, "Degraded")["reason"] == "DigestMismatch" and loaded == []
    assert "sha256 mismatch" in cond(failed, "Degraded")["message"]

    # the reviewed bytes roll out; the policy file names their digest
    f.write_bytes(v1)
    ok = await call(handlers.reconcile, body(spec, generation=2), memo, reason="update")
    assert cond(ok, "Ready")["reason"] == "RolledOut" and loaded == [v1]
    assert "modelSha256: " + sha(v1) in (Path(memo.settings.sink.directory) / "policy.yaml").read_text()

    # replaced afterwards: refused; the reviewed model keeps serving
    f.write_bytes(unreviewed)
    status = status_after(ok)
    await call(handlers.refresh, body(spec, 2, status), memo)
    assert ext.engine.model_info.version == "v1" and loaded == [v1]
    assert ext.engine.status()["model"]["errorPath"] == str(f)

    # the extender restarts (or the operator resumes) with those bytes at the path: Drift, not Ready
    from rlsched.extender.policy import PolicyEngine
    from rlsched.extender.settings import PolicySettings
    from rlsched.operator.testing import fake_model_loader

    ext.engine.close()
    ext.engine = PolicyEngine(
        PolicySettings(mode="active", fallback="least-allocated"), ext.engine.policy_file, fake_model_loader
    )
    ext.engine.start(strict_model=False)
    events.clear()
    drift = await call(handlers.refresh, body(spec, 2, status), memo)
    assert cond(drift, "Degraded")["reason"] == "Drift" and [e[1] for e in events] == ["Drift"]
    assert ext.engine.model is None
    resumed = kopf.Patch()
    with pytest.raises(kopf.PermanentError):  # resume does not report Ready for it either
        await call(handlers.reconcile, body(spec, 2, status), memo, reason="resume", patch=resumed)
    assert cond(resumed, "Ready")["status"] == "False"


async def test_a_path_that_failed_before_fails_again_at_once(env, tmp_path: Path) -> None:
    """The extender skipped a file that had failed and not changed without a word: the next generation
    naming it waited rolloutTimeoutS and reported RolloutTimeout instead of ModelLoadFailed."""
    memo, _, ext, _ = env
    good, bad = tmp_path / "good.npz", tmp_path / "bad.npz"
    good.write_bytes(fake_model("v1"))
    bad.write_bytes(b"\x00 not a model")
    await call(handlers.reconcile, body({"fallback": "least-allocated", "model": {"path": str(good)}}), memo)
    for generation, mode in ((2, "active"), (3, "shadow")):
        failed = kopf.Patch()
        spec = {"mode": mode, "fallback": "least-allocated", "model": {"path": str(bad)}}
        with pytest.raises(kopf.PermanentError):
            await call(handlers.reconcile, body(spec, generation), memo, reason="update", patch=failed)
        assert cond(failed, "Degraded")["reason"] == "ModelLoadFailed", cond(failed, "Degraded")["message"]
        assert "not a model file" in cond(failed, "Degraded")["message"]
    assert ext.engine.model_info.version == "v1"


async def test_resume_does_not_publish_a_generation_that_was_rolled_back(env) -> None:
    """Every operator restart published the known-bad generation again, verified it and rolled it back
    again (the current slot holds the rollback target, so nothing looked published for it)."""
    memo, kube, ext, events = env
    add_model(kube, "m1", fake_model("v1"))
    add_model(kube, "bad", b"\x00 not a model")
    s1 = {"mode": "shadow", "fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "m1", "key": "m.npz"}}}
    s2 = {**s1, "mode": "active", "model": {"configMapKeyRef": {"name": "bad", "key": "m.npz"}}}
    first = await call(handlers.reconcile, body(s1), memo)
    failed = kopf.Patch()
    with pytest.raises(kopf.PermanentError):
        await call(handlers.reconcile, body(s2, 2, status_after(first)), memo, reason="update", patch=failed)
    status = status_after(first, failed)
    writes: list = []
    write = memo.runtime.sink.write

    async def spy(slot, b):
        writes.append((slot, b.meta.get("generation")))
        await write(slot, b)

    memo.runtime.sink.write = spy
    for _restart in range(2):
        events.clear()
        patch = await call(handlers.reconcile, body(s2, 2, status), memo, reason="resume")
        assert writes == [] and events == [] and "conditions" not in patch.status
    assert ext.engine.settings.mode == "shadow" and ext.engine.model_info.version == "v1"
    # a new generation rolls out as usual
    add_model(kube, "m3", fake_model("v3"))
    s3 = {**s2, "model": {"configMapKeyRef": {"name": "m3", "key": "m.npz"}}}
    third = await call(handlers.reconcile, body(s3, 3, status), memo, reason="update")
    assert cond(third, "Ready")["reason"] == "RolledOut" and ext.engine.model_info.version == "v3"


async def test_a_refresh_tick_overlapping_a_rollout_reports_no_drift(env) -> None:
    """A tick whose /status answer was taken before a spec change compared it with the bundle the
    rollout had just published, and reported Drift for a rollout that went fine."""
    import asyncio

    memo, kube, ext, events = env
    add_model(kube, "m1", fake_model("v1"))
    add_model(kube, "m2", fake_model("v2"))
    s1 = {"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "m1", "key": "m.npz"}}}
    s2 = {"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "m2", "key": "m.npz"}}}
    first = await call(handlers.reconcile, body(s1), memo)
    status = {**status_after(first), "observedGeneration": 1}
    status_now = ext.status
    slow = {"once": True}

    async def slow_status():
        view = await status_now()
        if slow.pop("once", False):
            await asyncio.sleep(0.2)  # the answer is on its way while the spec changes
        return view

    ext.status = slow_status
    events.clear()
    tick = asyncio.create_task(call(handlers.refresh, body(s1, 1, status), memo))
    await asyncio.sleep(0.05)
    second = await call(handlers.reconcile, body(s2, 2, status), memo, reason="update")
    ticked = await tick
    assert cond(second, "Ready")["reason"] == "RolledOut"
    assert "conditions" not in ticked.status and [e[1] for e in events] == ["RollingOut", "RolledOut"]


async def test_drift_is_still_seen_after_a_resume_that_found_the_same_content_served(env) -> None:
    """A spec changed while the operator was down, leaving the bundle's content alone (generation 2): the
    resume confirmed what was served without publishing, the slot kept generation 1, and refresh then
    returned before comparing on every tick, so a drift was never reported."""
    import dataclasses

    memo, kube, ext, events = env
    add_model(kube, "models", fake_model("v1"))
    s1 = {"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "models", "key": "m.npz"}}}
    first = await call(handlers.reconcile, body(s1), memo)
    s2 = {**s1, "extenderWeight": 7}
    before = {"conditions": first.status["conditions"], "observedGeneration": 1}
    resumed = await call(handlers.reconcile, body(s2, 2, before), memo, reason="resume")
    assert cond(resumed, "Ready")["reason"] == "RolledOut"
    ext.engine.settings = dataclasses.replace(ext.engine.settings, mode="off")  # restarted without the policy
    ticked = await call(handlers.refresh, body(s2, 2, {**status_after(resumed), "observedGeneration": 2}), memo)
    assert cond(ticked, "Degraded")["reason"] == "Drift"


async def test_a_configmap_name_that_cannot_exist_is_invalid_not_retried(env) -> None:
    """Such a name was accepted and retried every 10 s as ModelSourceNotFound, forever."""
    memo, _, _, events = env
    failed = kopf.Patch()
    spec = {"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "Models_V2", "key": "m.npz"}}}
    with pytest.raises(kopf.PermanentError):
        await call(handlers.reconcile, body(spec), memo, patch=failed)
    assert cond(failed, "Degraded")["reason"] == "InvalidSpec" and events[-1][1] == "InvalidSpec"


def test_kopf_retry_delays_are_counted_not_summed_step_by_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """``while sum(out) + 30 <= total`` summed the list once per 30 s step, at start-up:
    13.8 s for an outageToleranceS of 30 days, about 35 minutes for a year."""
    sums: list[int] = []

    def counting_sum(values: list[float]) -> float:
        sums.append(len(values))
        return float(sum(values))

    monkeypatch.setattr(handlers, "sum", counting_sum, raising=False)  # module globals shadow the builtin
    week = handlers.retry_backoffs(7 * 86400)
    assert len(sums) <= 10  # the Fibonacci steps and one count, not one sum per 30 s entry
    assert week[:9] == [1, 1, 2, 3, 5, 8, 13, 21, 30] and set(week[8:]) == {30.0}
    assert 7 * 86400 - 30 < sum(week) <= 7 * 86400 and len(week) == 8 + (7 * 86400 - 54) // 30
    monkeypatch.undo()
    for total in (0.5, 10, 53, 54, 83.9, 84, 600, 601.5):  # the same delays as the step-by-step sum
        expected: list[float] = []
        for d in (1, 1, 2, 3, 5, 8, 13, 21):
            if sum(expected) + d > total:
                break
            expected.append(float(d))
        else:
            while sum(expected) + 30 <= total:
                expected.append(30.0)
        assert handlers.retry_backoffs(total) == (expected or [1.0]), total


async def test_a_full_decision_log_is_logged_once_not_per_pod_event(env, caplog: pytest.LogCaptureFixture) -> None:
    """With the log's disk full, every pod watch event logged an ERROR."""
    memo, _, _, _ = env

    async def full(lines: list) -> None:
        raise OSError(28, "No space left on device")

    memo.runtime.tracker = OutcomeTracker(full)
    with caplog.at_level(logging.INFO, logger="rlsched.operator"):
        for i in range(50):
            pod = {
                "metadata": {"uid": f"u{i}", "namespace": "ns", "name": f"p{i}"},
                "spec": {"schedulerName": "rl-scheduler", "nodeName": "n1"},
                "status": {"phase": "Running"},
            }
            await handlers.pod_event(type="ADDED", body=pod, memo=memo)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "No space left on device" in errors[0].getMessage()
    assert handlers.probe(memo=memo)["outcomeWriteFailed"] == 50


async def test_a_deleted_pod_is_forgotten_by_the_requeue(env, monkeypatch: pytest.MonkeyPatch) -> None:
    """The requeue remembers pods it stopped requeueing (bounded); a deleted pod's UID never comes back."""
    memo, _, _, _ = env
    forgotten: list[str] = []
    monkeypatch.setattr(memo.runtime.requeuer, "forget", forgotten.append, raising=False)
    pod = {"metadata": {"uid": "u1", "namespace": "ns", "name": "p1"}, "spec": {}, "status": {"phase": "Pending"}}
    await handlers.pod_event(type="MODIFIED", body=pod, memo=memo)
    await handlers.pod_event(type="DELETED", body=pod, memo=memo)
    assert forgotten == ["u1"]


# -- resume with the bundle published, an extender that goes away, a rollback interrupted ------------


def _count_fetches(memo: kopf.Memo) -> list:
    """The model sources the rollout fetches from here on."""
    fetcher = memo.runtime.rollout.fetcher
    fetch = fetcher.fetch
    fetched: list = []

    async def spy(namespace, spec):
        fetched.append(spec.model.describe() if spec.model else None)
        return await fetch(namespace, spec)

    fetcher.fetch = spy
    return fetched


async def test_an_extender_that_answers_once_and_goes_away_is_unreachable_not_a_timeout(env) -> None:
    """The extender answered once during the verification (still the old bundle) and then did not
    answer until rolloutTimeoutS: that ended as RolloutTimeout, rolled back and failed for good —
    the new generation was taken off the current slot because the extender's pod restarted."""
    from rlsched.operator.extender_client import ExtenderUnavailable

    memo, kube, ext, events = env
    add_model(kube, "m1", fake_model("v1"))
    add_model(kube, "m2", fake_model("v2"))
    s1 = {"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "m1", "key": "m.npz"}}}
    s2 = {"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "m2", "key": "m.npz"}}}
    first = await call(handlers.reconcile, body(s1), memo)
    status = status_after(first)
    real_status = ext.status
    answers = {"left": 1}

    async def answers_once_then_restarts():
        if answers["left"] <= 0:
            raise ExtenderUnavailable("GET http://extender/status: ConnectionRefusedError")
        answers["left"] -= 1
        return ExtenderView.from_status({"policy": ext.engine.status()})  # not re-read yet: the old bundle

    ext.status = answers_once_then_restarts
    events.clear()
    failed = kopf.Patch()
    with pytest.raises(kopf.TemporaryError):
        await call(handlers.reconcile, body(s2, 2, status), memo, reason="update", patch=failed)
    assert cond(failed, "Degraded")["reason"] == "ExtenderUnreachable"
    assert [e[1] for e in events] == ["RollingOut", "ExtenderUnreachable"]
    current = await memo.runtime.sink.read(CURRENT)
    assert current.meta["generation"] == 2 and current.meta.get("rollbackOf") is None  # stays published
    ext.status = real_status  # back: the retry verifies generation 2
    retried = await call(handlers.reconcile, body(s2, 2, status), memo, reason="update")
    assert cond(retried, "Ready")["reason"] == "RolledOut" and ext.engine.model_info.version == "v2"


@pytest.mark.parametrize("source", ["new bytes", "deleted", "new bytes, sha256 pinned"])
async def test_resume_with_the_extender_away_leaves_the_model_source_alone(env, source: str) -> None:
    """On a restart with the extender not answering (both pods restarted), the bundle found published
    was passed over and the model fetched again: new bytes under the same key were published (and
    served once the extender was back), a source gone since (an expired URL, a deleted ConfigMap)
    failed the policy, and with sha256 pinned new bytes failed it for good (DigestMismatch)."""
    memo, kube, ext, events = env
    v1 = fake_model("v1")
    add_model(kube, "models", v1)
    spec: dict = {"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "models", "key": "m.npz"}}}
    if "pinned" in source:
        spec["model"]["sha256"] = sha(v1)
    first = await call(handlers.reconcile, body(spec), memo)
    status = status_after(first)
    if source == "deleted":
        del kube.configmaps[("sched", "models")]
    else:
        add_model(kube, "models", fake_model("v2-unreviewed"))
    fetched = _count_fetches(memo)
    ext.reachable = False
    events.clear()
    away = kopf.Patch()
    with pytest.raises(kopf.TemporaryError):
        await call(handlers.reconcile, body(spec, 1, status), memo, reason="resume", patch=away)
    assert (
        cond(away, "Degraded")["reason"] == "ExtenderUnreachable"
        and "stays published" in cond(away, "Ready")["message"]
    )
    assert fetched == [] and [e[1] for e in events] == ["ExtenderUnreachable"]
    ext.reachable = True  # kopf retries the resume
    back = await call(handlers.reconcile, body(spec, 1, status_after(first, away)), memo, reason="resume")
    assert cond(back, "Ready")["reason"] == "RolledOut" and ext.engine.model_info.version == "v1"
    assert fetched == []


async def test_resume_publishes_the_bundle_it_finds_again_without_fetching_it(env) -> None:
    """The extender answers but does not serve the published bundle (restarted without its files, or
    still loading): the very bundle found published is published again and verified — before, the
    model was fetched again and new bytes under the same key rolled out unreviewed."""
    import dataclasses

    memo, kube, ext, events = env
    add_model(kube, "models", fake_model("v1"))
    spec = {"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "models", "key": "m.npz"}}}
    first = await call(handlers.reconcile, body(spec), memo)
    add_model(kube, "models", fake_model("v2-unreviewed"))
    fetched = _count_fetches(memo)
    ext.engine.settings = dataclasses.replace(ext.engine.settings, mode="off")  # not what was published
    events.clear()
    patch = await call(handlers.reconcile, body(spec, 1, status_after(first)), memo, reason="resume")
    assert cond(patch, "Ready")["reason"] == "RolledOut" and [e[1] for e in events] == ["RollingOut", "RolledOut"]
    assert fetched == [] and ext.engine.model_info.version == "v1" and ext.engine.settings.mode == "active"


async def test_a_slot_without_its_model_bytes_is_built_again_on_resume(env) -> None:
    """Guard for the rule above (a bundle found published is never built again): only a slot that
    holds the published model's bytes counts as published; one that lost them (a corrupt slot) would
    be published again without its model, so it is built again from the source."""
    memo, kube, ext, events = env
    add_model(kube, "models", fake_model("v1"))
    spec = {"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "models", "key": "m.npz"}}}
    first = await call(handlers.reconcile, body(spec), memo)
    current = await memo.runtime.sink.read(CURRENT)
    (Path(memo.settings.sink.directory) / current.model_name).unlink()
    fetched = _count_fetches(memo)
    ps = parse_spec(spec)
    assert await memo.runtime.rollout.published_for("sched", "default", 1, ps) is None
    patch = await call(handlers.reconcile, body(spec, 1, status_after(first)), memo, reason="resume")
    assert cond(patch, "Ready")["reason"] == "RolledOut" and fetched == ["configmap models/m.npz"]


@pytest.mark.parametrize("cause", ["update", "create"])
async def test_a_run_again_after_a_restart_mid_rollback_does_not_publish_the_bad_generation(env, cause) -> None:
    """kopf stores what it handled only when the handler finished: an operator stopped while the
    rollback was being verified ran the same create/update again — not resume, the only cause that
    read rollbackOf — and published and loaded the known-bad model again."""
    memo, kube, ext, events = env
    add_model(kube, "good", fake_model("v1"))
    add_model(kube, "bad", b"\x00 not a model")
    s1 = {"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "good", "key": "m.npz"}}}
    s2 = {"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "bad", "key": "m.npz"}}}
    gen = 1 if cause == "create" else 2
    status: dict = {}
    if cause == "update":
        status = status_after(await call(handlers.reconcile, body(s1), memo))
    with pytest.raises(kopf.PermanentError):
        await call(handlers.reconcile, body(s2, gen, status), memo, reason=cause)
    loaded: list = []
    loader = ext.engine.model_loader
    ext.engine.model_loader = lambda path, typical: (loaded.append(path), loader(path, typical))[1]
    fetched = _count_fetches(memo)
    events.clear()
    again = kopf.Patch()
    with pytest.raises(kopf.PermanentError):  # the status the interrupted run never wrote
        await call(handlers.reconcile, body(s2, gen, status), memo, reason=cause, patch=again)
    assert loaded == [] and fetched == [] and [e[1] for e in events] == ["RolledBack"]
    d = cond(again, "Degraded")
    assert d["reason"] == "ModelLoadFailed" and "before the operator restarted" in d["message"]
    assert again.status["observedGeneration"] == gen
    # a new generation rolls out as usual
    add_model(kube, "m3", fake_model("v3"))
    s3 = {"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "m3", "key": "m.npz"}}}
    third = await call(handlers.reconcile, body(s3, gen + 1, status), memo, reason="update")
    assert cond(third, "Ready")["reason"] == "RolledOut" and ext.engine.model_info.version == "v3"


async def test_a_policy_created_again_under_the_same_name_is_not_taken_for_its_rolled_back_namesake(env) -> None:
    """Guard: generation 1 of a new object (the old one deleted with its finalizer removed by hand while
    no operator ran, so the slot still names the rollback) rolls out: rollbackOf belongs to another uid."""
    memo, kube, ext, events = env
    add_model(kube, "bad", b"\x00 not a model")
    add_model(kube, "good", fake_model("v1"))
    s_bad = {"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "bad", "key": "m.npz"}}}
    with pytest.raises(kopf.PermanentError):
        await call(handlers.reconcile, body(s_bad), memo)
    assert (await memo.runtime.sink.read(CURRENT)).meta.get("rollbackUid") == "uid-1"
    b = body({"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "good", "key": "m.npz"}}})
    b["metadata"]["uid"] = "uid-2"
    patch = await call(handlers.reconcile, b, memo)
    assert cond(patch, "Ready")["reason"] == "RolledOut" and ext.engine.model_info.version == "v1"


# -- an extender lost after the publish, try after try; rollback marks of older operators ----------


async def _v1_rolled_out_and_the_spec_of(memo: kopf.Memo, kube: FakeKube, name: str, data: bytes) -> tuple[dict, dict]:
    """Model v1 rolled out (generation 1), and the spec of the model ``data`` in ConfigMap ``name``;
    returns that spec and the status after v1."""
    add_model(kube, "good", fake_model("v1"))
    add_model(kube, name, data)
    s1 = {"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "good", "key": "m.npz"}}}
    s2 = {"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": name, "key": "m.npz"}}}
    return s2, status_after(await call(handlers.reconcile, body(s1), memo))


async def _v1_rolled_out_then_a_crashing_v2(memo: kopf.Memo, kube: FakeKube, ext: EngineExtender) -> tuple[dict, dict]:
    """Model v1 rolled out (generation 1), and the spec of a v2 that crashes the extender once published
    (:func:`_crashes_on`); returns that spec and the status after v1."""
    s2, status = await _v1_rolled_out_and_the_spec_of(memo, kube, "crash", fake_model("v2-crashes-the-extender"))
    _crashes_on(memo, ext, "configmap crash/m.npz")
    return s2, status


def _crashes_on(memo: kopf.Memo, ext: EngineExtender, source: str) -> None:
    """Once the current slot names ``source``, the extender answers once per publish (the old bundle:
    it has not read the new one yet) and then never again — a model that OOM-kills it while loading."""
    from rlsched.operator.extender_client import ExtenderUnavailable

    rollout, real_status = memo.runtime.rollout, ext.status
    left = {"answers": 0}

    async def status():
        if (await rollout.sink.read(CURRENT)).meta.get("source") != source:
            return await real_status()
        if left["answers"] <= 0:
            raise ExtenderUnavailable("GET http://extender/status: ConnectionRefusedError (CrashLoopBackOff)")
        left["answers"] -= 1
        return ExtenderView.from_status({"policy": ext.engine.status()})

    publish = rollout.publish

    async def publish_and_answer_once(bundle):
        left["answers"] = 1
        return await publish(bundle)

    ext.status = status
    rollout.publish = publish_and_answer_once


async def test_a_model_that_crashes_the_extender_is_rolled_back_on_the_third_try_in_a_row(env) -> None:
    """The extender answered once after the publish (still the old bundle), then never again: every try
    ended ExtenderUnreachable, the bundle stayed published, and each kopf retry published it again —
    never rolled back. Three such tries of the generation (counted in status.lostAfterPublish) roll back
    with ExtenderLostAfterPublish; a run again after a restart reports that reason from the mark."""
    memo, kube, ext, events = env
    s2, status = await _v1_rolled_out_then_a_crashing_v2(memo, kube, ext)
    events.clear()
    for retry in (0, 1):
        patch = kopf.Patch()
        with pytest.raises(kopf.TemporaryError):
            await call(handlers.reconcile, body(s2, 2, status), memo, "update", patch, retry=retry)
        assert cond(patch, "Ready")["reason"] == "ExtenderUnreachable"
        assert patch.status["lostAfterPublish"] == {"generation": 2, "tries": retry + 1}
        status = {**status, **patch.status}  # what kopf's next try reads
    last = kopf.Patch()
    with pytest.raises(kopf.PermanentError):
        await call(handlers.reconcile, body(s2, 2, status), memo, "update", last, retry=2)
    d = cond(last, "Degraded")
    assert d["reason"] == "ExtenderLostAfterPublish" and "on 3 tries" in d["message"], d["message"]
    assert "rolled back to model v1" in d["message"] and ext.engine.model_info.version == "v1"
    assert last.status["lostAfterPublish"] is None and last.status["lastGood"]["generation"] == 1
    assert [e[1] for e in events] == ["RollingOut", "ExtenderUnreachable"] * 2 + ["RollingOut", "RolledBack"]
    # The operator stopped before kopf stored the outcome: the update runs again, publishes nothing.
    events.clear()
    again = kopf.Patch()
    with pytest.raises(kopf.PermanentError):
        await call(handlers.reconcile, body(s2, 2, status), memo, "update", again, retry=3)
    d = cond(again, "Degraded")
    assert (
        d["reason"] == "ExtenderLostAfterPublish" and "stopped answering after its bundle was published" in d["message"]
    )
    assert [e[1] for e in events] == ["RolledBack"] and ext.engine.model_info.version == "v1"


@pytest.mark.parametrize("tries_before_restart", [1, 2])
async def test_a_crashing_model_is_still_rolled_back_after_the_operator_restarts(env, tries_before_restart) -> None:
    """The operator restarted after one or two lost tries: kopf runs the handler again as resume, which
    found the bundle published, the extender silent, and retried without counting the try — the
    crashing model stayed published for good. The tries before the restart count: the third rolls back."""
    memo, kube, ext, events = env
    s2, status = await _v1_rolled_out_then_a_crashing_v2(memo, kube, ext)
    for retry in range(tries_before_restart):
        patch = kopf.Patch()
        with pytest.raises(kopf.TemporaryError):
            await call(handlers.reconcile, body(s2, 2, status), memo, "update", patch, retry=retry)
        status = {**status, **patch.status}
    outcomes = []
    for retry in range(LOST_AFTER_PUBLISH_TRIES):  # the restarted operator: resume, retried as resume
        patch = kopf.Patch()
        try:
            await call(handlers.reconcile, body(s2, 2, status), memo, "resume", patch, retry=retry)
        except kopf.TemporaryError:
            outcomes.append(cond(patch, "Ready")["reason"])
            status = {**status, **patch.status}
            continue
        except kopf.PermanentError:
            outcomes.append(cond(patch, "Degraded")["reason"])
        break
    assert outcomes == ["ExtenderUnreachable"] * (LOST_AFTER_PUBLISH_TRIES - 1 - tries_before_restart) + [
        "ExtenderLostAfterPublish"
    ]
    assert ext.engine.model_info.version == "v1"


async def test_a_resume_that_finds_the_model_served_clears_the_lost_count(env) -> None:
    """The extender pod restarted twice during a good rollout (two lost tries, not the model's fault),
    then served it. A resume that finds it served must clear the count: left standing, a later restart
    while the extender is down for maintenance counted a third try and rolled the good model back."""
    from rlsched.operator.extender_client import ExtenderUnavailable

    memo, kube, ext, events = env
    healthy, publish = ext.status, memo.runtime.rollout.publish
    s2, status = await _v1_rolled_out_then_a_crashing_v2(memo, kube, ext)  # the pod restarts, not the model
    for retry in (0, 1):
        patch = kopf.Patch()
        with pytest.raises(kopf.TemporaryError):
            await call(handlers.reconcile, body(s2, 2, status), memo, "update", patch, retry=retry)
        status = {**status, **patch.status}
    assert status["lostAfterPublish"] == {"generation": 2, "tries": 2}
    ext.status, memo.runtime.rollout.publish = healthy, publish  # back, and serving v2
    patch = await call(handlers.reconcile, body(s2, 2, status), memo, "resume")
    assert cond(patch, "Ready")["reason"] == "RolledOut" and patch.status["lostAfterPublish"] is None
    status = {**status, **patch.status}

    async def down() -> None:
        raise ExtenderUnavailable("GET http://extender/status: connection refused (node maintenance)")

    ext.status = down
    patch = kopf.Patch()
    with pytest.raises(kopf.TemporaryError):
        await call(handlers.reconcile, body(s2, 2, status), memo, "resume", patch)
    assert cond(patch, "Ready")["reason"] == "ExtenderUnreachable"
    assert ext.engine.model_info.version == "v2-crashes-the-extender"  # served, and not rolled back


async def test_a_rollback_written_half_way_is_not_taken_for_the_failed_bundle(env, monkeypatch) -> None:
    """The rollback's policy file was written, its metadata not (disk full): the slot held the good
    model's settings beside the failed generation's metadata and model. Resume took that mix for the
    generation's bundle, published it again and the extender reported the good model's file missing."""
    from rlsched.operator import sink as sink_module

    memo, kube, ext, events = env
    s2, status = await _v1_rolled_out_and_the_spec_of(memo, kube, "bad", b"truncated")
    write = sink_module._atomic_write

    def disk_full_at_the_rollbacks_metadata(path, data) -> None:  # noqa: ANN001
        if path.name == "bundle.json" and b'"rollbackOf": 2' in data:
            raise OSError(28, "No space left on device")
        write(path, data)

    monkeypatch.setattr(sink_module, "_atomic_write", disk_full_at_the_rollbacks_metadata)
    with pytest.raises(kopf.TemporaryError):
        await call(handlers.reconcile, body(s2, 2, status), memo, "update")
    monkeypatch.setattr(sink_module, "_atomic_write", write)
    assert await memo.runtime.rollout.published_for("sched", "default", 2, handlers.parse_spec(s2)) is None


def test_lost_tries_count_for_their_generation_until_the_extender_answers() -> None:
    """The count read back from status.lostAfterPublish: the record of the generation's last lost try,
    whatever kopf's retry or cause (an operator restarted in between, a try that failed before the
    verification); another generation starts over; a record of the wrong shape counts nothing."""
    record = {"generation": 2, "tries": 2}
    status = {"lostAfterPublish": record}
    assert handlers._lost_before(status, 2) == 2
    assert handlers._lost_before(status, 3) == 0
    assert handlers._lost_before({"lostAfterPublish": dict(record, tries=99)}, 2) == 3  # capped
    assert handlers._lost_before({"lostAfterPublish": dict(record, tries="2")}, 2) == 0
    assert handlers._lost_before({"lostAfterPublish": dict(record, tries=True)}, 2) == 0
    assert handlers._lost_before({"lostAfterPublish": [1]}, 2) == 0
    assert handlers._lost_before({}, 2) == 0 and handlers._lost_before(None, 2) == 0


async def test_an_api_hiccup_between_lost_tries_does_not_start_the_count_over(env, monkeypatch) -> None:
    """The try that would roll back fails to read the last-good slot once (an API hiccup: PublishFailed,
    retried). The count stays: the next try, with the extender still silent (it crash-loops on the
    bundle and never answers again), rolls back. Before, that hiccup reset the count and every later
    try, silent, stayed ExtenderUnreachable: the crashing bundle was never rolled back."""
    from rlsched.operator.sink import LAST_GOOD

    memo, kube, ext, events = env
    s2, status = await _v1_rolled_out_then_a_crashing_v2(memo, kube, ext)
    sink = memo.runtime.sink
    real_read, fail = sink.read, {"last_good": 0}

    async def read(slot):
        if slot == LAST_GOOD and fail["last_good"] > 0:
            fail["last_good"] -= 1
            raise SinkError("configmaps rlsched-policy-last-good: 503 Service Unavailable")
        return await real_read(slot)

    monkeypatch.setattr(sink, "read", read)
    reasons = []
    for retry in range(5):
        fail["last_good"] = 1 if retry == 2 else 0
        patch = kopf.Patch()
        try:
            await call(handlers.reconcile, body(s2, 2, status), memo, "update", patch, retry=retry)
        except kopf.TemporaryError:
            pass
        except kopf.PermanentError:
            reasons.append(cond(patch, "Degraded")["reason"])
            break
        reasons.append(cond(patch, "Degraded")["reason"])
        status = {k: v for k, v in {**status, **patch.status}.items() if v is not None}
    assert reasons == ["ExtenderUnreachable", "ExtenderUnreachable", "PublishFailed", "ExtenderLostAfterPublish"]
    assert ext.engine.model_info.version == "v1"


async def _older_operators_mark(memo: kopf.Memo, of: int) -> None:
    """The current slot as an older operator left it: the rollback target marked ``rollbackOf`` with no
    ``rollbackUid`` (some of those operators marked every failure, a timeout too)."""
    import dataclasses

    sink = memo.runtime.sink
    current = await sink.read(CURRENT)
    meta = {k: v for k, v in current.meta.items() if k not in ("rollbackUid", "rollbackReason")}
    await sink.write(CURRENT, dataclasses.replace(current, meta=dict(meta, rollbackOf=of)))


async def test_an_older_operators_mark_does_not_fail_an_update_run_again(env) -> None:
    """After an upgrade, a mark an older operator left (it marked a RolloutTimeout of generation 2 too,
    and no uid) made the update kopf runs again report ModelLoadFailed and fail for good. A run again of
    create/update takes only a mark naming the object's uid: generation 2 rolls out."""
    memo, kube, ext, events = env
    add_model(kube, "m1", fake_model("v1"))
    add_model(kube, "m2", fake_model("v2"))
    s1 = {"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "m1", "key": "m.npz"}}}
    s2 = {"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "m2", "key": "m.npz"}}}
    status = status_after(await call(handlers.reconcile, body(s1), memo))
    await _older_operators_mark(memo, 2)
    patch = await call(handlers.reconcile, body(s2, 2, status), memo, reason="update")
    assert cond(patch, "Ready")["reason"] == "RolledOut" and ext.engine.model_info.version == "v2"


async def test_an_older_operators_mark_does_not_stop_a_policy_created_again_under_the_same_name(env) -> None:
    """A uid-less mark (an older operator's) of generation 1, and a policy deleted and created again
    under the same name (another uid): its create was refused as the namesake's rollback."""
    memo, kube, ext, events = env
    add_model(kube, "bad", b"\x00 not a model")
    add_model(kube, "good", fake_model("v1"))
    s_bad = {"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "bad", "key": "m.npz"}}}
    with pytest.raises(kopf.PermanentError):
        await call(handlers.reconcile, body(s_bad), memo)
    await _older_operators_mark(memo, 1)
    b = body({"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": "good", "key": "m.npz"}}})
    b["metadata"]["uid"] = "uid-2"
    patch = await call(handlers.reconcile, b, memo)
    assert cond(patch, "Ready")["reason"] == "RolledOut" and ext.engine.model_info.version == "v1"


async def test_resume_still_takes_an_older_operators_mark(env) -> None:
    """Guard: resume leaves a generation an older operator rolled back (a uid-less mark) alone, as it
    always did: the bad model is not published again on the upgrade's restart."""
    memo, kube, ext, events = env
    s2, status = await _v1_rolled_out_and_the_spec_of(memo, kube, "bad", b"\x00 not a model")
    failed = kopf.Patch()
    with pytest.raises(kopf.PermanentError):
        await call(handlers.reconcile, body(s2, 2, status), memo, reason="update", patch=failed)
    await _older_operators_mark(memo, 2)
    fetched = _count_fetches(memo)
    events.clear()
    await call(handlers.reconcile, body(s2, 2, status_after(failed)), memo, reason="resume")
    assert fetched == [] and events == [] and ext.engine.model_info.version == "v1"
