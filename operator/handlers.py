"""The kopf handlers, registered into a registry the caller owns (:func:`build_registry`).

SchedulingPolicy (``rlsched.io/v1alpha1``):

- create / update (``spec`` only) / resume → :func:`reconcile`: validate (invalid → ``Degraded``,
  reason ``InvalidSpec``, a message naming each field, ``PermanentError``), build the bundle, roll it
  out, report what the extender loaded, roll back on failure; an event on every transition.
  Progress is stored in annotations (``kopf.rlsched.io/…``), so a handler that finished is never
  run again for the same change — also across operator and API-server restarts. A generation whose
  model failed and was rolled back is not published again (the rollback's ``rollbackOf`` says so):
  not by ``resume``, nor by the ``create``/``update`` kopf runs again when the operator stopped
  before that handler finished (there only a mark naming this object's uid counts; ``resume`` also
  takes an older operator's mark without one). On ``resume``, a bundle already published for the
  generation is verified as it is (published again when the extender answers without serving it),
  never built again: the model source is not fetched, and an extender that does not answer is
  retried. Tries that end with the extender lost after the bundle was published are counted in
  ``status.lostAfterPublish`` (:func:`_lost_before`; only an answer from the extender clears it), so
  that a bundle that crashes the extender is rolled back (``ExtenderLostAfterPublish``).
- delete → :func:`retire`: the extender goes back to its own settings (an empty policy file).
- a timer → :func:`refresh`: ``status.counts`` from the extender, and drift (the extender no longer
  serves what was rolled out: restarted without the files, …) as ``Degraded``.
- policies other than the served one (``--policy NAMESPACE/NAME``) → ``Ready=False, NotServed``.

Pods of our scheduler (``spec.schedulerName``, filtered server-side): an index of pending pods
(``pending_pods``: requeue bookkeeping), and every watch event into the outcome tracker.

Operator-wide: login with the operator's own credentials; start-up configures kopf from
:class:`~rlsched.operator.settings.OperatorSettings` and starts the runtime; clean-up stops it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any, NoReturn

import kopf

from .conditions import condition, get_condition, merge_conditions, now_iso
from .extender_client import ExtenderUnavailable, ExtenderView
from .kube import Kube
from .requeue import PendingPod, pending_pod
from .rollout import LOST_AFTER_PUBLISH_TRIES, Cause, RolloutResult, SourceError, bundle_label, serves
from .runtime import Runtime, start_runtime
from .settings import OperatorSettings
from .sink import CURRENT, Bundle, ModelTooLarge, SinkError
from .spec import GROUP, PLURAL, VERSION, PolicySpec, SpecError, crd_manifests, parse_spec

log = logging.getLogger("rlsched.operator")

POLICY = (GROUP, VERSION, PLURAL)
PODS = ("", "v1", "pods")
PROGRESS_PREFIX = "kopf.rlsched.io"


# -- status helpers --------------------------------------------------------------------------------


def _iso(ts: float | None) -> str | None:
    """An RFC 3339 time, or None for a time that is not one (the extender's answer is not trusted: a
    value in milliseconds, 1e300 or below zero raised on every tick)."""
    if not ts:
        return None
    try:
        return now_iso(ts)
    except (ValueError, OverflowError, OSError):
        return None


def _model_status(view: ExtenderView | None) -> dict[str, Any] | None:
    if view is None:
        return None
    if not view.model_loaded:
        return {"version": None, "digest": None, "path": None, "loadedAt": None}
    return {"version": view.version, "digest": view.digest, "path": view.model_path, "loadedAt": _iso(view.loaded_at)}


def _counts(view: ExtenderView) -> dict[str, int]:
    c = view.counters
    return {
        "decisions": c.get("decisions", 0),
        "policy": c.get("policy", 0),
        "fallbacks": c.get("fallback", 0),
        "shadowAgree": c.get("shadowAgree", 0),
        "shadowDisagree": c.get("shadowDisagree", 0),
    }


def _set_conditions(
    patch: kopf.Patch, status: Mapping[str, Any] | None, generation: int | None, *updates: dict[str, Any]
) -> None:
    patch.status["conditions"] = merge_conditions((status or {}).get("conditions"), updates)
    if generation is not None:
        patch.status["observedGeneration"] = generation


def _ready(ok: bool, reason: str, message: str, generation: int | None) -> dict[str, Any]:
    return condition("Ready", ok, reason, message, generation)


def _degraded(bad: bool, reason: str, message: str, generation: int | None) -> dict[str, Any]:
    return condition("Degraded", bad, reason, message, generation)


def _failing(
    patch: kopf.Patch, status: Mapping[str, Any] | None, generation: int | None, reason: str, message: str
) -> None:
    """Ready False and Degraded True, for one reason and message."""
    _set_conditions(
        patch,
        status,
        generation,
        _ready(False, reason, message, generation),
        _degraded(True, reason, message, generation),
    )


def _transition(body: kopf.Body, type_: str, reason: str, message: str) -> None:
    """A Kubernetes event for the policy (kopf posts it in the handler's context)."""
    (kopf.warn if type_ == "Warning" else kopf.info)(body, reason=reason, message=message)


# -- SchedulingPolicy ------------------------------------------------------------------------------


async def reconcile(
    body: kopf.Body,
    spec: kopf.Spec,
    meta: kopf.Meta,
    status: kopf.Status,
    namespace: str | None,
    name: str,
    uid: str,
    patch: kopf.Patch,
    memo: kopf.Memo,
    reason: str,
    **_: Any,
) -> None:
    """Validate, roll out, verify, roll back (module docstring)."""
    assert namespace is not None  # SchedulingPolicy is namespaced (kopf's protocol allows cluster-scoped ones)
    rt: Runtime = memo.runtime
    generation = meta.get("generation")
    cause = str(reason)  # kopf.Reason: create | update | resume
    for key in [k for k in rt.runs if k[0] == uid and k[1] != generation]:
        del rt.runs[key]  # earlier generations' counts: one policy edited for months must not grow it
    rt.runs[(uid, generation, cause)] += 1
    log.info(
        "policy %s/%s generation %s: %s handler runs",
        namespace,
        name,
        generation,
        cause,
        extra={"event": "reconcile", "policy": f"{namespace}/{name}", "generation": generation, "cause": cause},
    )
    try:
        ps = parse_spec(spec)
    except SpecError as exc:
        message = "the spec is invalid: " + "; ".join(exc.problems)
        _failing(patch, status, generation, "InvalidSpec", message)
        _transition(body, "Warning", "InvalidSpec", message)
        raise kopf.PermanentError(message) from None
    rt.reward_weights = dict(ps.reward_weights)
    rt.objective = ps.objective.to_spec()
    async with rt.lock(uid):
        # Every cause, not only resume: kopf stores what it handled once the handler finished, so an
        # operator stopped during the rollback's verification runs create/update again (a spec change
        # bumps the generation: rollbackOf naming this one is a run again of the same change).
        rolled_back = await _rolled_back_before(rt, namespace, name, uid, generation, cause)
        if rolled_back is not None:
            if cause != "resume":  # the run that rolled back never wrote its status: say why here
                _report_rolled_back(rolled_back, body, status, patch, generation)
            return
        settings_status = {"mode": ps.mode, "fallback": ps.fallback, "extenderWeight": ps.extender_weight}
        # The operator restarted: what it published for this generation may still be served. Then it
        # is verified as it is, never built again (module docstring of rollout: the model source may
        # have changed or gone since).
        published = await rt.rollout.published_for(namespace, name, generation, ps) if cause == "resume" else None
        if published is not None:
            patch.status["extender"] = settings_status
            if await _served_on_resume(rt, published, body, patch, status, generation):
                log.info(
                    "policy %s/%s: the extender already serves generation %s; nothing to roll out "
                    "(the model was not fetched again)",
                    namespace,
                    name,
                    generation,
                )
                return
            bundle = published  # answers, but does not serve it (yet): published again and verified below
        else:
            bundle = await _build(rt, body, status, patch, namespace, name, uid, generation, ps)
            patch.status["extender"] = settings_status
            if cause == "resume":
                try:
                    current = await rt.sink.read(CURRENT)
                except SinkError as exc:  # unknown: publish it again below, as for a changed spec
                    log.warning("resume: cannot read the served bundle (%s); publishing it again", exc)
                    current = None
                if bundle.same_content(current) and await _confirm_served(rt, bundle, patch, status, generation):
                    log.info(
                        "policy %s/%s: the extender already serves generation %s; nothing to roll out",
                        namespace,
                        name,
                        generation,
                    )
                    return

        _transition(
            body,
            "Normal",
            "RollingOut",
            f"generation {generation}: publishing {bundle_label(bundle)} (mode {ps.mode}, fallback {ps.fallback}) "
            f"to {rt.sink.describe()}",
        )
        try:
            result = await rt.rollout.apply(bundle, lost_before=_lost_before(status, generation))
        except ModelTooLarge as exc:
            _failing(patch, status, generation, "ModelTooLarge", str(exc))
            _transition(body, "Warning", "ModelTooLarge", str(exc))
            raise kopf.PermanentError(str(exc)) from None
        except SinkError as exc:
            _failing(patch, status, generation, "PublishFailed", str(exc))
            _transition(body, "Warning", "PublishFailed", str(exc))
            raise kopf.TemporaryError(str(exc), delay=15) from None
        if result.lost_tries:
            patch.status[LOST] = {"generation": generation, "tries": result.lost_tries}
        elif status and status.get(LOST) is not None:
            patch.status[LOST] = None
        await _note_policy(rt, body, generation, ps.mode, result)
        report(result, body, status, patch, generation)


LOST = "lostAfterPublish"
"""The status field counting the tries of a generation that ended with the extender lost after the
bundle was published: ``{generation, tries}`` (:func:`_lost_before`)."""


def _lost_before(status: Mapping[str, Any] | None, generation: int | None) -> int:
    """How many tries of this generation ended with the extender lost after the bundle was published
    (:data:`~rlsched.operator.rollout.LOST_AFTER_PUBLISH_TRIES`), from the record the last of them
    wrote. A try that ends before the verification (the publication or the model source failing)
    leaves the record as it is: an extender crash-looping on the bundle never answers again (it loads
    the model before its status port opens), and an API hiccup in between must not start the count
    over, or the bundle would never be rolled back. Only a try whose extender answered (whatever
    followed) clears it, and a new generation starts again."""
    record = (status or {}).get(LOST)
    if not isinstance(record, Mapping):
        return 0
    tries = record.get("tries")
    if record.get("generation") != generation or isinstance(tries, bool) or not isinstance(tries, int):
        return 0
    return max(0, min(tries, LOST_AFTER_PUBLISH_TRIES))


async def _build(
    rt: Runtime,
    body: kopf.Body,
    status: kopf.Status,
    patch: kopf.Patch,
    namespace: str,
    name: str,
    uid: str,
    generation: int | None,
    ps: PolicySpec,
) -> Bundle:
    """The bundle for the spec (the model fetched); a model source that fails is reported and raised
    to kopf (temporary or permanent, as the :class:`SourceError` says)."""
    try:
        return await rt.rollout.build(namespace, name, generation, ps, uid=uid)
    except SourceError as exc:
        _failing(patch, status, generation, exc.reason, str(exc))
        _transition(body, "Warning", exc.reason, str(exc))
        if exc.temporary:
            raise kopf.TemporaryError(str(exc), delay=10) from None
        raise kopf.PermanentError(str(exc)) from None


async def _served_on_resume(
    rt: Runtime, published: Bundle, body: kopf.Body, patch: kopf.Patch, status: kopf.Status, generation: int | None
) -> bool:
    """On resume, with ``published`` found in the current slot: True (Ready) when the extender serves
    it; False when it answers but does not (the caller publishes the same bundle again and verifies
    it). An extender that does not answer is retried (``TemporaryError``): the bundle stays published
    and its model source is left alone — fetching it again could publish other bytes under the same
    key or URL, or fail on a source gone since (an expired URL) although the extender serves the model.

    Unless earlier tries of this generation ended with the extender lost after the publication
    (``lostAfterPublish``): then False too, so that this try counts as one more of them and the third
    rolls back (:data:`~rlsched.operator.rollout.LOST_AFTER_PUBLISH_TRIES`). Retried as above, a
    model that crash-loops the extender stayed published for good once the operator had restarted."""
    try:
        view = await rt.extender.status()
    except ExtenderUnavailable as exc:
        if _lost_before(status, generation):
            log.warning("resume: the extender does not answer (%s), as after the last tries: trying again", exc)
            return False
        message = (
            f"the extender does not answer ({exc}); {bundle_label(published)} stays published and is "
            "verified when it answers"
        )
        _failing(patch, status, generation, "ExtenderUnreachable", message)
        _transition(body, "Warning", "ExtenderUnreachable", message)
        raise kopf.TemporaryError(message, delay=15) from None
    return _served(view, published, patch, status, generation)


async def _rolled_back_before(
    rt: Runtime, namespace: str, name: str, uid: str, generation: int | None, cause: str
) -> Bundle | None:
    """Was this generation rolled back already (the current slot holds the rollback target, marked
    ``rollbackOf`` this generation of this object)? Then the rollback target, and the generation is
    not published again — the rollout failed for good until the spec changes. The rollback target
    stays published and is checked once; a restart is not a retry of a bad model.

    A slot marked by an older operator names no ``rollbackUid`` — and operators before that one
    marked every failure, a timeout too. ``resume`` takes such a mark, as it always did (the
    generation alone decides); ``create``/``update`` only a mark naming this object's uid: an older
    operator's mark is ignored there, as those operators did (a policy created again under the same
    name is not taken for its namesake, nor a timeout reported as a model that failed)."""
    try:
        current = await rt.sink.read(CURRENT)
    except SinkError as exc:  # unknown: roll out as for any change
        log.warning("cannot read the served bundle (%s)", exc)
        return None
    if (
        current is None
        or generation is None
        or current.meta.get("policy") != f"{namespace}/{name}"
        or current.meta.get("rollbackOf") != generation
        or current.meta.get("rollbackUid") not in ((None, uid) if cause == "resume" else (uid,))
    ):
        return None
    try:
        served = serves(await rt.extender.status(), current)
    except ExtenderUnavailable as exc:
        served = False
        log.warning("resume: the extender does not answer (%s)", exc)
    log.log(
        logging.INFO if served else logging.WARNING,
        "policy %s/%s generation %s was rolled back to %s before this restart; not publishing it again "
        "(the extender %s the rollback target)",
        namespace,
        name,
        generation,
        bundle_label(current),
        "serves" if served else "does not (yet) serve",
        extra={"event": "resume_rolled_back", "policy": f"{namespace}/{name}", "generation": generation},
    )
    return current


_ROLLED_BACK_BECAUSE = {
    Cause.LOAD_ERROR: "the extender could not load its model",
    Cause.LOST_AFTER_PUBLISH: (
        f"the extender stopped answering after its bundle was published, on {LOST_AFTER_PUBLISH_TRIES} tries"
    ),
}
"""What a rollback's mark (``rollbackReason``) says failed: the causes that mark one
(:attr:`~rlsched.operator.rollout.Cause.model_failed`)."""


def _report_rolled_back(
    target: Bundle, body: kopf.Body, status: kopf.Status, patch: kopf.Patch, generation: int | None
) -> NoReturn:
    """The status and event of a generation found rolled back by a run that did not finish (the
    operator stopped during the rollback's verification). The reason is the mark's ``rollbackReason``;
    a mark without one (an operator before it, which marked only a model that failed to load —
    uid-less marks of older ones never get here) is ``ModelLoadFailed``."""
    marked = target.meta.get("rollbackReason")
    why = next((c for c in _ROLLED_BACK_BECAUSE if c.value == marked), Cause.LOAD_ERROR)
    message = (
        f"generation {generation}: {_ROLLED_BACK_BECAUSE[why]}; rolled back to "
        f"{bundle_label(target)} before the operator restarted; fix the spec (or the model) and apply it again"
    )
    _failing(patch, status, generation, why.value, message)
    _transition(body, "Warning", "RolledBack", message)
    raise kopf.PermanentError(message)


async def _note_policy(
    rt: Runtime, body: Mapping[str, Any], generation: int | None, mode: str, result: RolloutResult
) -> None:
    """A ``policy`` line in the decision log: which model, reward weights and objective hold from here on."""
    if rt.decision_log is None:
        return
    meta = body.get("metadata") or {}
    line = {
        "type": "policy",
        "policy": f"{meta.get('namespace')}/{meta.get('name')}",
        "generation": generation,
        "mode": mode,
        "ok": result.ok,
        "reason": result.reason,
        "modelVersion": result.view.version if result.view and result.view.model_loaded else None,
        "rewardWeights": rt.reward_weights,
        "objective": rt.objective,
        "time": round(time.time(), 3),
    }
    try:
        await rt.decision_log.awrite([line])
    except OSError as exc:
        log.error("cannot write to the decision log: %s", exc)


def report(
    result: RolloutResult, body: kopf.Body, status: Mapping[str, Any] | None, patch: kopf.Patch, generation: int | None
) -> None:
    """Status, conditions and an event from a rollout's result; raises to tell kopf what next."""
    if result.view is not None:
        patch.status["model"] = _model_status(result.view)
        patch.status["counts"] = _counts(result.view)
    if result.ok:
        b = result.bundle
        patch.status["lastGood"] = {
            "version": result.view.version if result.view else None,
            "digest": b.digest,
            "path": b.settings.get("modelPath"),
            "generation": generation,
        }
        _set_conditions(
            patch,
            status,
            generation,
            _ready(True, "RolledOut", result.message, generation),
            _degraded(False, "AsExpected", "", generation),
        )
        _transition(body, "Normal", "RolledOut", f"generation {generation}: {result.message}")
        return
    if result.reason == "ExtenderUnreachable":
        _failing(patch, status, generation, "ExtenderUnreachable", result.message)
        _transition(body, "Warning", "ExtenderUnreachable", result.message)
        raise kopf.TemporaryError(result.message, delay=15)
    if result.rolled_back_to is not None and result.rollback_ok:
        t = result.rolled_back_to
        patch.status["lastGood"] = {
            "version": result.view.version if result.view and result.view.model_loaded else None,
            "digest": t.digest,
            "path": t.settings.get("modelPath"),
            "generation": t.meta.get("generation"),
        }
    message = f"generation {generation}: {result.message}; fix the spec (or the model) and apply it again"
    _failing(patch, status, generation, result.reason, message)
    _transition(body, "Warning", "RolledBack", message)
    raise kopf.PermanentError(message)


async def _confirm_served(rt: Runtime, bundle: Any, patch: kopf.Patch, status: kopf.Status, generation: Any) -> bool:
    """When the extender serves ``bundle``: Ready (RolledOut) with its model and counts; else False."""
    try:
        view = await rt.extender.status()
    except ExtenderUnavailable:
        return False
    return _served(view, bundle, patch, status, generation)


def _served(view: ExtenderView, bundle: Any, patch: kopf.Patch, status: kopf.Status, generation: Any) -> bool:
    """:func:`_confirm_served` with the extender's answer at hand."""
    if not serves(view, bundle):
        return False
    if status and status.get(LOST) is not None:  # it answered: a later silence starts a new count
        patch.status[LOST] = None
    patch.status["model"] = _model_status(view)
    patch.status["counts"] = _counts(view)
    _set_conditions(
        patch,
        status,
        generation,
        _ready(True, "RolledOut", f"the extender serves {bundle_label(bundle)}", generation),
        _degraded(False, "AsExpected", "", generation),
    )
    return True


async def retire(body: kopf.Body, namespace: str | None, name: str, uid: str, memo: kopf.Memo, **_: Any) -> None:
    """The served policy is deleted: the extender returns to its own settings."""
    rt: Runtime = memo.runtime
    async with rt.lock(uid):
        try:
            await rt.rollout.revert()
        except SinkError as exc:
            raise kopf.TemporaryError(f"cannot reset {rt.sink.describe()}: {exc}", delay=10) from None
    kopf.info(
        body,
        reason="Retired",
        message=f"policy deleted: {rt.sink.describe()} reset; the extender serves its own settings",
    )
    log.info("policy %s/%s deleted: the extender serves its own settings", namespace, name)


async def refresh(
    body: kopf.Body, meta: kopf.Meta, status: kopf.Status, uid: str, patch: kopf.Patch, memo: kopf.Memo, **_: Any
) -> None:
    """Counts from the extender; drift and recovery as conditions (only after a successful rollout)."""
    rt: Runtime = memo.runtime
    if rt.lock(uid).locked():
        return
    generation = meta.get("generation")
    ready = get_condition(status, "Ready")
    degraded = get_condition(status, "Degraded")
    observed = status.get("observedGeneration") if status else None
    watching = (ready or {}).get("status") == "True" or (degraded or {}).get("reason") in (
        "Drift",
        "ExtenderUnreachable",
    )
    try:
        view = await rt.extender.status()
    except ExtenderUnavailable as exc:
        if watching and (degraded or {}).get("reason") != "ExtenderUnreachable" and observed == generation:
            message = f"the extender does not answer: {exc}"
            _set_conditions(
                patch,
                status,
                None,
                _ready(False, "ExtenderUnreachable", message, generation),
                _degraded(True, "ExtenderUnreachable", message, generation),
            )
            _transition(body, "Warning", "ExtenderUnreachable", message)
        return
    patch.status["counts"] = _counts(view)
    if not watching or observed != generation:
        return
    try:
        expected = await rt.sink.read(CURRENT)
    except SinkError as exc:  # the next tick tries again; the sink logs what is wrong with the slot
        log.debug("refresh: cannot read the served bundle: %s", exc)
        return
    # The awaits above let a rollout start (a spec change), or even finish: its new bundle is not what
    # this tick's view of the extender was taken for, and comparing them would report a false Drift.
    # An older generation in the slot is fine: a resume that found the same content served keeps it.
    published = expected.meta.get("generation") if expected is not None else None
    newer = isinstance(published, int) and isinstance(generation, int) and published > generation
    if expected is None or rt.lock(uid).locked() or newer:
        return
    ok = serves(view, expected)
    was_degraded = (degraded or {}).get("status") == "True"
    # An extender that answers again after an outage but no longer serves this generation drifted —
    # unless the outage was a rollout's of this generation (never rolled out yet: its retry goes on).
    last_good = status.get("lastGood") if status else None
    rolled_out = isinstance(last_good, Mapping) and last_good.get("generation") == generation
    came_back = (degraded or {}).get("reason") == "ExtenderUnreachable" and rolled_out
    if ok and was_degraded:
        message = f"the extender serves {bundle_label(expected)} again"
        patch.status["model"] = _model_status(view)
        _set_conditions(
            patch,
            status,
            None,
            _ready(True, "RolledOut", message, generation),
            _degraded(False, "AsExpected", "", generation),
        )
        _transition(body, "Normal", "Recovered", message)
    elif not ok and (not was_degraded or came_back):
        message = (
            f"the extender serves mode={view.mode} fallback={view.fallback} model={view.model_path or 'none'}"
            f"{' (load error: ' + view.error + ')' if view.error else ''}, not the rolled-out "
            f"{bundle_label(expected)}; it may have restarted without the published files"
        )
        patch.status["model"] = _model_status(view)
        _set_conditions(
            patch,
            status,
            None,
            _ready(False, "Drift", message, generation),
            _degraded(True, "Drift", message, generation),
        )
        _transition(body, "Warning", "Drift", message)


async def not_served(
    body: kopf.Body, meta: kopf.Meta, status: kopf.Status, patch: kopf.Patch, memo: kopf.Memo, **_: Any
) -> None:
    s: OperatorSettings = memo.settings
    generation = meta.get("generation")
    message = (
        f"this operator serves the SchedulingPolicy {s.policy.namespace}/{s.policy.name} "
        f"(rlsched operator --policy); this one has no effect"
    )
    if (get_condition(status, "Ready") or {}).get("reason") != "NotServed":
        _transition(body, "Warning", "NotServed", message)
    _set_conditions(patch, status, generation, _ready(False, "NotServed", message, generation))


async def rebalance(spec: kopf.Spec, status: kopf.Status, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """A rebalancing cycle when ``spec.rebalance`` asks for one and it is due (:mod:`.rebalancer`).

    Skipped while a rollout runs, with an invalid spec (``reconcile`` reports it) and while the
    extender does not answer: evicted pods must find the scheduler serving."""
    rt: Runtime | None = memo.get("runtime")
    if rt is None or rt.rebalancer is None:
        return
    try:
        ps = parse_spec(spec)
    except SpecError:
        return
    rs = ps.rebalance
    previous: Any = (status.get("rebalance") if status else None) or {}
    if not isinstance(previous, Mapping):  # a status edited by hand (the CRD does not fix its shape)
        previous = {}
    if not rs.enabled:
        if previous.get("outcome") not in (None, "disabled"):
            patch.status["rebalance"] = {"outcome": "disabled", "message": "spec.rebalance.enabled is false"}
        return
    if not rt.rebalancer.due(rs):
        return
    if any(rt.lock(key).locked() for key in list(rt.locks)):
        return
    try:
        await rt.extender.status()
    except ExtenderUnavailable as exc:
        rt.rebalancer.skipped()
        patch.status["rebalance"] = {"outcome": "skipped", "message": f"the extender does not answer: {exc}"[:500]}
        return
    report = await rt.rebalancer.cycle(rs, previous, ps.fallback)
    patch.status["rebalance"] = rt.rebalancer.as_status(report)


# -- pods ------------------------------------------------------------------------------------------


def index_pending(body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict[str, PendingPod | None]:
    """Pending pods by UID. Pods that stop being pending leave the index through the ``when``
    filter (kopf keeps an object's previous value when the function returns None)."""
    pod = pending_pod(body, memo.settings.requeue.annotation)
    return {body.get("metadata", {}).get("uid", ""): pod}


async def pod_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:  # noqa: A002 - kopf's name
    """Outcomes into the decision log (the tracker counts and logs its own write failures, once per kind
    of error: this runs on every pod event), notices for rejected pods, and the requeue's memory of a
    deleted pod dropped."""
    rt: Runtime | None = memo.get("runtime")
    if rt is None:
        return
    if rt.tracker is not None:
        await rt.tracker.observe(type, body)
    if type == "DELETED":
        rt.requeuer.forget(str((body.get("metadata") or {}).get("uid", "")))
    else:
        pod = pending_pod(body, rt.settings.requeue.annotation)
        if pod is not None and pod.rejected and not pod.rejection_noted:
            rt.rejections.rejected(pod.uid, pod.namespace, pod.name, pod.rejected)


# -- operator-wide ---------------------------------------------------------------------------------


def probe(memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """Liveness (``--liveness URL``): fails when a background task died; reports a few counters."""
    rt: Runtime | None = memo.get("runtime")
    if rt is None:
        return {"state": "starting"}
    problems = rt.problems()
    if problems:
        raise kopf.PermanentError("; ".join(problems))
    return {
        "requeued": rt.requeuer.requeued,
        "requeueScheduled": rt.requeuer.scheduled,
        "requeueFailed": rt.requeuer.failed,
        "decisionsDrained": rt.drainer.drained,
        "decisionsSkipped": rt.drainer.skipped,
        "decisionAnswersRefused": rt.drainer.bad_answers,
        "decisionWriteFailed": rt.drainer.write_failed,
        "outcomeWriteFailed": rt.tracker.write_failed if rt.tracker is not None else 0,
        # Whether draining fails, not why: this endpoint is open (kubelet probes carry no token) and the
        # error names the extender's URL; the reason is in the operator's log (once per outage).
        "drainFailing": rt.drainer.last_error is not None,
        "rebalanced": dict(rt.rebalancer.totals) if rt.rebalancer is not None else None,
    }


def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    kube: Kube = memo.kube
    return kube.connection_info()


async def startup(
    settings: kopf.OperatorSettings, memo: kopf.Memo, pending_pods: kopf.Index[str, PendingPod | None], **_: Any
) -> None:
    s: OperatorSettings = memo.settings
    configure_kopf(settings, s)
    if s.install_crds:
        for manifest in crd_manifests():
            await memo.kube.apply_crd(manifest)
        for manifest in crd_manifests():
            for _attempt in range(60):
                if await memo.kube.crd_established(manifest["metadata"]["name"]):
                    break
                await asyncio.sleep(0.5)
        log.info("CRDs applied: %s", ", ".join(m["metadata"]["name"] for m in crd_manifests()))

    def lookup(uid: str) -> PendingPod | None:
        for pod in pending_pods.get(uid, ()):
            if pod is not None:
                return pod
        return None

    def pending() -> list[PendingPod]:
        return [pod for store in list(pending_pods.values()) for pod in store if pod is not None]

    memo.runtime = start_runtime(s, memo.kube, lookup, pending)
    log.info(
        "operator started: policy %s/%s, sink %s, extender %s, decision log %s, requeue %s",
        s.policy.namespace,
        s.policy.name,
        memo.runtime.sink.describe(),
        s.extender.status_url,
        s.decision_log.path or "off",
        "on" if s.requeue.enabled else "off",
        extra={"event": "started"},
    )


async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    rt: Runtime | None = memo.get("runtime")
    if rt is not None:
        await rt.stop()
        log.info("operator stopped (decision log closed)", extra={"event": "stopped"})


def retry_backoffs(total_s: float) -> list[float]:
    """kopf's retry delays: 1, 1, 2, 3, 5, 8, 13, 21, then 30 s each, adding up to ``total_s``. The 30 s
    steps are counted, not summed up one by one (that took seconds at start-up for a tolerance of days;
    ``kubernetes.outageToleranceS`` is bounded by settings validation)."""
    out: list[float] = []
    for d in (1, 1, 2, 3, 5, 8, 13, 21):
        if sum(out) + d > total_s:
            return out or [1.0]
        out.append(float(d))
    return out + [30.0] * int((total_s - sum(out)) // 30)


def configure_kopf(settings: kopf.OperatorSettings, s: OperatorSettings) -> None:
    """kopf's settings from ours (called at start-up)."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PROGRESS_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PROGRESS_PREFIX, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{GROUP}/operator"
    settings.posting.reporting_component = "rlsched-operator"
    settings.posting.level = logging.INFO
    settings.watching.field_selectors[PODS] = f"spec.schedulerName={s.scope.scheduler_name}"
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 60
    settings.networking.connect_timeout = 10
    settings.networking.error_backoffs = retry_backoffs(s.kubernetes.outage_tolerance_s)
    settings.process.ultimate_exiting_timeout = 30


# -- the registry ----------------------------------------------------------------------------------


def build_registry(settings: OperatorSettings) -> kopf.OperatorRegistry:
    """A registry with every handler; the caller runs it (``kopf.operator(registry=...)``)."""
    registry = kopf.OperatorRegistry()
    ref = (settings.policy.namespace, settings.policy.name)
    scheduler = settings.scope.scheduler_name

    def is_served(namespace: str | None, name: str | None, **_: Any) -> bool:
        return (namespace, name) == ref

    def is_ours(spec: kopf.Spec, **_: Any) -> bool:
        return spec.get("schedulerName") == scheduler

    def is_pending(body: kopf.Body, spec: kopf.Spec, **_: Any) -> bool:
        return spec.get("schedulerName") == scheduler and pending_pod(body, settings.requeue.annotation) is not None

    kopf.on.login(registry=registry)(login)
    # kopf passes indexes by their id (pending_pods) through **kwargs, which its ActivityFn protocol cannot name
    kopf.on.startup(registry=registry)(startup)  # type: ignore[arg-type]
    kopf.on.cleanup(registry=registry)(cleanup)
    kopf.on.probe(id="rlsched", registry=registry)(probe)

    kopf.on.create(*POLICY, id="rollout", when=is_served, registry=registry)(reconcile)
    kopf.on.update(*POLICY, id="rollout", field="spec", when=is_served, registry=registry)(reconcile)
    kopf.on.resume(*POLICY, id="rollout", when=is_served, registry=registry)(reconcile)
    kopf.on.delete(*POLICY, id="retire", when=is_served, registry=registry)(retire)
    kopf.timer(
        *POLICY,
        id="refresh",
        interval=settings.extender.status_interval_s,
        initial_delay=settings.extender.status_interval_s,
        when=is_served,
        registry=registry,
    )(refresh)
    if settings.rebalancer.enabled:
        kopf.timer(
            *POLICY,
            id="rebalance",
            interval=settings.rebalancer.tick_s,
            initial_delay=settings.rebalancer.tick_s,
            when=is_served,
            registry=registry,
        )(rebalance)
    for decorator in (kopf.on.create, kopf.on.resume):
        decorator(*POLICY, id="not-served", when=kopf.not_(is_served), registry=registry)(not_served)

    kopf.index(*PODS, id="pending_pods", when=is_pending, registry=registry)(index_pending)
    kopf.on.event(*PODS, id="pod-outcomes", when=is_ours, registry=registry)(pod_event)
    return registry
