"""Requeue of pods the policy delayed, so they do not wait for kube-scheduler's 5-minute flush.

Why an annotation moves the pod (kube-scheduler v1.37, pkg/scheduler): when an extender filters out
nodes and the pod ends up unschedulable, ``schedule_one.go`` adds the pseudo-plugin ``Extender`` to
the pod's ``UnschedulablePlugins``; the framework registers that name for *every* cluster event
with no QueueingHint (``framework/runtime/framework.go``: ``defaultEnqueueExtension``,
``UnrollWildCardResource``). An update of the unscheduled pod itself is such an event
(``PriorityQueue.Update`` → ``PodSchedulingPropertiesChange`` → ``TargetPod/Update``), so bumping
``rlsched.io/requeue-attempt`` moves the pod from the unschedulable pool to the backoff/active
queue. The first rejection is also retried once by kube-scheduler itself (its own status update of
the PodScheduled condition is such an event); later identical rejections are not — that is where
the pod would sit for ``podMaxInUnschedulablePodsDuration`` (5 min) without the operator.

:class:`Requeuer` learns about delays from the extender's decision records (``verdict: delay``,
``retryAfterSeconds``) and, as a fallback, from pending pods whose PodScheduled condition says
"delayed by policy" (operator restarts). It bumps the annotation after
``max(retryAfterSeconds, min(initialS · 2^n, maxS))`` where n is the requeues done so far (read
back from the annotation, so the count survives restarts), and gives up with a ``RequeueGaveUp``
event after ``maxAttempts``: once per pod, when a delay finds its annotation there. The annotation is
the durable record that the requeues ended: the sweep passes such pods over without a word, and
the memory of the pods told is bounded without forgetting any to make room (:data:`MEMORY`: past it,
no more are told, so no pod is told twice). Pods that were bound, deleted or recreated meanwhile are
dropped.

Both inputs come from outside, so neither may stall the others: a ``retryAfterSeconds`` that is not
a finite number within ``[0, RETRY_AFTER_FACTOR · maxS]`` (``json.loads`` reads ``NaN`` as nan and
``1e400`` as inf) counts as absent, condition messages are read only up to
``MAX_CONDITION_MESSAGE`` characters, and one pod whose requeue fails is logged, counted
(``failed``) and skipped.

A requeue that fails for good — the patch refused (400, 403, 422: RBAC, the admission policy, a bad
annotation), failing otherwise (5xx, 429, 401, no answer) ``MAX_TRANSIENT_RETRIES`` times in a row
(with backoff), or raising something
unexpected — stops the requeues of that pod: it is remembered like a pod given up on, so the sweep
does not schedule it again (the annotation never moved, so ``maxAttempts`` would never end it), and
forgotten when the pod is deleted (:meth:`Requeuer.forget`) or no longer pending. Nothing on the pod
records such a failure, and forgetting the oldest to make room had the sweep bring exactly those
back, patching and posting events for them again on every round. So that memory is bounded per
namespace and in all, and never stops the requeues of another namespace:

- a namespace with :data:`NAMESPACE_MEMORY` pending pods whose requeues failed for good (a quota
  or admission policy of its own, pods whose annotations are full) pauses its own requeues until
  some of those pods are deleted or bound (logged at ERROR each time the pause starts);
- past :data:`MEMORY` such pods in all, a new failure is not remembered (logged once): that pod is
  retried with the ordinary backoff, its failures counted as requeues (after a few, once every
  ``maxS`` seconds), not on every sweep.

kube-scheduler's own retries go on.
"""

from __future__ import annotations

import asyncio
import calendar
import heapq
import logging
import math
import re
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .log_once import LogOnce
from .settings import REJECTED_ANNOTATION, ROOM_ANNOTATION, RequeueSettings

log = logging.getLogger("rlsched.operator.requeue")

ROOM_REQUEUES = 3
"""Room requeues per pod at most."""

DELAYED = re.compile(r"delayed by policy[^(]*(?:\(retry in (\d+(?:\.\d+)?)s\))?")
"""The extender's filter reason for a delayed pod (rlsched.extender.verbs, ``_verdict``)."""
DELAYED_UNTIL = re.compile(r"delayed by policy \S+ until (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")
"""The end of the hold the same reason announces (UTC, the extender's clock)."""
REJECTED = re.compile(r"rejected by policy(?: [a-z0-9](?:[-a-z0-9.]*[a-z0-9])?)?:?\s*")
"""Where the policy's reason for a rejected pod starts, after the scheduler's name (a DNS-1123
subdomain: dots allowed, never last); it runs to kube-scheduler's "preemption:" or the end. Only
the prefix is matched and the rest cut with ``str.partition``: one pattern that also matched the
end with a lazy group took quadratic time on long whitespace runs."""
MAX_CONDITION_MESSAGE = 4096
"""Characters of a PodScheduled message that are parsed: the extender's reasons sit at its start,
and pending_pod runs on every pod watch event, so a huge message must not cost more than this."""
RETRY_AFTER_FACTOR = 10.0
"""A policy's ``retryAfterSeconds`` is cut to this many times ``requeue.maxS``: kube-scheduler retries
the pod itself every 5 minutes anyway, and the policy may delay it again when it is asked."""


def retry_after(value: object, limit: float = math.inf) -> float | None:
    """``value`` as a retry delay in seconds, at most ``limit`` (a longer one is cut to it: the pod is
    asked again then, and the policy may delay it again); None (the default backoff applies) when it is
    not a number, not finite or negative. Booleans are not numbers here; an int too large for a float
    is not finite."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        seconds = float(value)
    except OverflowError:
        return None
    return min(seconds, limit) if math.isfinite(seconds) and seconds >= 0.0 else None


@dataclass(frozen=True)
class PendingPod:
    """What the pod index keeps about an unbound pod of our scheduler."""

    uid: str
    namespace: str
    name: str
    attempt: int
    """Requeues done so far (the annotation's value)."""
    delayed: bool
    """PodScheduled=False with the extender's "delayed by policy" reason."""
    retry_after_s: float | None
    rejected: str | None
    """The policy's reason when the condition says "rejected by policy"."""
    rejection_noted: bool = False
    """The pod carries :data:`REJECTED_ANNOTATION`: its rejection was told (before a restart, maybe)."""
    delayed_until: float | None = None
    """When the hold the condition announces has ended for sure (epoch seconds: its "until", written
    cut to the second, plus one; None when it says no time)."""


def pending_pod(body: Mapping[str, Any], annotation: str) -> PendingPod | None:
    """The index entry for a pod (None when it is bound, terminating or finished)."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    if spec.get("nodeName") or meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
        return None
    annotations = meta.get("annotations") or {}
    try:
        attempt = int(annotations.get(annotation, "0"))
    except (TypeError, ValueError):
        attempt = 0
    delayed, retry, rejected, until = False, None, None, None
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            msg = str(c.get("message") or "")[:MAX_CONDITION_MESSAGE]
            m = DELAYED.search(msg)
            if m:
                delayed = True
                retry = retry_after(float(m.group(1))) if m.group(1) else None  # 400 digits: inf
                u = DELAYED_UNTIL.search(msg)
                until = _utc(u.group(1)) if u else None
                if until is not None:
                    until += 1.0  # written cut to the second: the hold ends within the second after
            r = REJECTED.search(msg)
            if r:
                reason, cut, _ = msg[r.end() :].partition("preemption:")
                if cut:  # kube-scheduler's addition, after ". "
                    reason = reason.rstrip().removesuffix(".")
                rejected = reason.strip().rstrip(".") or "rejected by policy"
    return PendingPod(
        uid=meta.get("uid", ""),
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        attempt=max(attempt, 0),
        delayed=delayed,
        retry_after_s=retry,
        rejected=rejected,
        rejection_noted=isinstance(annotations, Mapping) and REJECTED_ANNOTATION in annotations,
        delayed_until=until,
    )


def _utc(text: str) -> float | None:
    """``2026-11-26T14:03:05Z`` as epoch seconds; None when it is no such time."""
    try:
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


Patch = Callable[[str, str, str, Mapping[str, str]], Awaitable[Any]]
Event = Callable[[Mapping[str, Any], str, str, str], Coroutine[Any, Any, None]]


MAX_TRANSIENT_RETRIES = 8
"""Transient failures in a row (5xx, timeouts, 429) after which a pod's requeue is dropped: retried
at 5, 10, 20, … s up to 5 minutes apart, about 15 minutes in all."""
GONE = (404, 409)
"""Patch answers that mean the pod was deleted or recreated (the ``metadata.uid`` precondition):
nothing is left to requeue, and nothing failed."""
REFUSED = (400, 403, 422)
"""Patch answers that refuse this patch for good (a bad request, RBAC or an admission policy, an
invalid annotation): the same patch would be refused again. Any other failure (401 from an expired
token, 5xx, 429, a lost answer) is retried with backoff."""
MEMORY = 50_000
"""Pods remembered per bookkeeping map. Retries, last requeues and failures not remembered: the oldest
are forgotten past it. Pods given up on and pods whose requeue failed for good: none is forgotten to
make room (the sweep would bring exactly those back, every round); a full one loses the pods no
longer pending at the next sweep (:meth:`Requeuer.sweep`), and takes no more while it stays full
(module docstring)."""
NAMESPACE_MEMORY = 5_000
"""Pods of one namespace whose requeue failed for good that are remembered; at it, that namespace's
requeues pause (module docstring). Well below :data:`MEMORY`, so one namespace's refusals (its own
quota or admission policy) fill at most a tenth of the memory and never pause another namespace."""


def _remember(memory: OrderedDict[str, Any], uid: str, value: Any = None) -> None:
    """``memory[uid] = value`` as the newest entry, the oldest forgotten beyond :data:`MEMORY`."""
    memory[uid] = value
    memory.move_to_end(uid)
    while len(memory) > MEMORY:
        memory.popitem(last=False)


def _keep(memory: OrderedDict[str, None], uid: str) -> bool:
    """Remember ``uid`` while there is room (none is forgotten to make it); whether it is remembered."""
    if uid not in memory and len(memory) >= MEMORY:
        return False
    memory[uid] = None
    return True


class Requeuer:
    """Schedules and performs requeues (module docstring)."""

    def __init__(
        self,
        settings: RequeueSettings,
        lookup: Callable[[str], PendingPod | None],
        pending: Callable[[], Iterable[PendingPod]],
        patch: Patch,
        event: Event,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ):
        self.settings = settings
        self.lookup, self.pending, self.patch, self.event = lookup, pending, patch, event
        self.clock, self.wall = clock, wall
        self._heap: list[tuple[float, str]] = []
        self._due: dict[str, tuple[float, str, str]] = {}
        self._last: OrderedDict[str, float] = OrderedDict()
        self._gave_up: OrderedDict[str, None] = OrderedDict()
        """Pods told ``RequeueGaveUp`` (module docstring): bounded, none forgotten to make room."""
        self._dropped: OrderedDict[str, str] = OrderedDict()
        """UID → namespace of pods whose requeue failed for good (module docstring): not scheduled
        again until deleted or bound; at most :data:`NAMESPACE_MEMORY` per namespace and
        :data:`MEMORY` in all, none forgotten to make room."""
        self._dropped_in: Counter[str] = Counter()
        """Namespace → its pods in ``_dropped``; at :data:`NAMESPACE_MEMORY` its requeues pause."""
        self._paused: set[str] = set()
        """Namespaces whose requeues pause (:attr:`paused_namespaces`), as last logged."""
        self._unkept: OrderedDict[str, int] = OrderedDict()
        """UID → requeues that failed for good while ``_dropped`` was full (module docstring): counted
        into its backoff; the oldest forgotten past :data:`MEMORY`."""
        self._told_full = False
        """That ``_dropped`` is full was logged (again once it had room in between)."""
        self._wake = asyncio.Event()
        self._once = LogOnce(log).log
        self.requeued = 0
        self.given_up = 0
        self.failed = 0
        """Pods whose scheduling or requeue raised, or whose requeue was refused or kept failing (skipped;
        the others go on)."""
        self._retries: OrderedDict[str, int] = OrderedDict()
        """UID → transient failures of its pending requeue in a row (backoff, then it is dropped)."""
        self._room: OrderedDict[str, int] = OrderedDict()
        """UID → room requeues done (:meth:`on_room`; at most :data:`ROOM_REQUEUES`, bounded by
        :data:`MEMORY` pods)."""
        self._room_due: set[str] = set()
        """UIDs whose scheduled requeue (in ``_due``) is a room requeue."""

    @property
    def max_retry_after_s(self) -> float:
        """The largest ``retryAfterSeconds`` honoured (``RETRY_AFTER_FACTOR`` · ``maxS``)."""
        return RETRY_AFTER_FACTOR * self.settings.max_s

    def backoff(self, done: int, retry_after_s: float | None = None) -> float:
        """Seconds before requeue number ``done + 1`` (finite: a bad ``retry_after_s`` is ignored)."""
        s = self.settings
        retry = retry_after(retry_after_s, self.max_retry_after_s)
        return max(retry or 0.0, min(s.initial_s * (2.0 ** min(done, 30)), s.max_s))

    # -- inputs -------------------------------------------------------------------------------------
    def on_verdict(self, record: Mapping[str, Any]) -> None:
        """A decision record with ``verdict: delay`` (others are ignored here)."""
        if record.get("verdict") != "delay":
            return
        pod = record.get("pod") or {}
        if pod.get("uid"):
            asked = record.get("retryAfterSeconds")
            retry = retry_after(asked, self.max_retry_after_s)
            if retry is None and asked is not None:
                self._once(
                    f"retry:{pod['uid']}",
                    logging.WARNING,
                    "pod %s/%s: ignoring retryAfterSeconds=%.40r (not a finite number of seconds); using the backoff",
                    pod.get("namespace", ""),
                    pod.get("name", ""),
                    asked,
                )
            self.delayed(pod["uid"], pod.get("namespace", ""), pod.get("name", ""), self._left(record, retry))

    def _left(self, record: Mapping[str, Any], retry: float | None) -> float | None:
        """What is left of the hold ``retry`` when the record is read: the record dates the verdict
        (``time``, the extender's wall clock), and one read late — the operator was down, or slow to
        drain — counted the whole hold again from the reading (a 60 s hold read 10 minutes late was
        requeued 11 minutes after the verdict). Never more than the hold itself, whatever the clocks
        say; with no usable date, the hold as it is."""
        at = retry_after(record.get("time"))  # a finite number or None (a huge integer too)
        return self._left_until(retry, None if at is None or retry is None else at + retry)

    def _left_of(self, pod: PendingPod) -> float | None:
        """:meth:`_left` for a pod the sweep found delayed: its condition says until when."""
        return self._left_until(pod.retry_after_s, pod.delayed_until)

    def _left_until(self, retry: float | None, until: float | None) -> float | None:
        """The seconds from now to ``until`` (the wall clock), within ``[0, retry]``; ``retry`` as it is
        when either is unknown."""
        if retry is None or until is None:
            return retry
        return min(retry, max(0.0, until - self.wall()))

    def _stopped(self, uid: str, namespace: str) -> bool:
        """Whether the requeues of ``uid`` ended (given up on after ``maxAttempts``, or failed for
        good), or those of its namespace pause (:attr:`paused_namespaces`)."""
        return uid in self._gave_up or uid in self._dropped or self._dropped_in[namespace] >= NAMESPACE_MEMORY

    @property
    def paused_namespaces(self) -> frozenset[str]:
        """Namespaces with :data:`NAMESPACE_MEMORY` pending pods whose requeues failed for good: no
        requeue of theirs is scheduled (module docstring) until some of those pods are deleted or
        bound. Other namespaces' requeues go on."""
        return frozenset(ns for ns, n in self._dropped_in.items() if n >= NAMESPACE_MEMORY)

    def _prune(self) -> None:
        """A full memory of pods given up on, and the pods dropped once a namespace pauses or the memory
        is full, lose the pods no longer pending (bound, or deleted without the event reaching
        :meth:`forget`), at most once per sweep; a pause that starts or ends is logged."""
        if len(self._gave_up) >= MEMORY:
            for uid in [uid for uid in self._gave_up if self.lookup(uid) is None]:
                del self._gave_up[uid]
        if len(self._dropped) >= MEMORY or self._paused:
            for uid in [uid for uid in self._dropped if self.lookup(uid) is None]:
                self._undrop(uid)
        self._told_full = self._told_full and len(self._dropped) >= MEMORY
        self._log_pauses()

    def _log_pauses(self) -> None:
        """Log each namespace whose requeues start or stop pausing, once per change."""
        paused = self.paused_namespaces
        for ns in sorted(paused - self._paused):
            log.error(
                "namespace %s: the requeues of %d pending pods failed for good (patches refused: a quota or "
                "admission policy of the namespace? full annotations?); no requeue is scheduled in that "
                "namespace until some of those pods are deleted or bound (an operator restart tries them "
                "again); other namespaces are not affected",
                ns,
                self._dropped_in[ns],
                extra={"event": "requeue_paused", "namespace": ns},
            )
        for ns in sorted(self._paused - paused):
            log.warning("namespace %s: pods whose requeues failed for good were deleted or bound: requeues go on", ns)
        self._paused = set(paused)

    def _undrop(self, uid: str) -> None:
        """``uid`` leaves the memory of pods whose requeue failed for good (if it is there)."""
        namespace = self._dropped.pop(uid, None)
        if namespace is not None:
            self._dropped_in[namespace] -= 1
            if self._dropped_in[namespace] <= 0:
                del self._dropped_in[namespace]

    def forget(self, uid: str) -> None:
        """The pod was deleted: its UID never comes back, so nothing about it needs remembering."""
        self._undrop(uid)
        for memory in (self._gave_up, self._last, self._retries, self._unkept, self._room):
            memory.pop(uid, None)
        self._room_due.discard(uid)

    def delayed(self, uid: str, namespace: str, name: str, retry_after_s: float | None) -> None:
        if not self.settings.enabled or (uid in self._due and uid not in self._room_due):
            return
        known = self.lookup(uid)
        if known is None:
            # bound, gone, or not yet in the index (the sweep finds it there): a record read again
            # after a restart must not announce a requeue to a pod that no longer waits
            log.debug("pod %s/%s delayed, but it is not a pending pod of ours: no requeue", namespace, name)
            return
        if self._stopped(uid, known.namespace):  # the index's namespace, whatever the record said
            return
        done = known.attempt
        if done >= self.settings.max_attempts:
            self._give_up(uid, namespace, name, done)
            return
        # Failures not remembered (module docstring) count as requeues done: backoff, not every sweep.
        self._room_due.discard(uid)  # a pending room requeue gives way to the delay's own
        wait = self._enqueue(uid, namespace, name, self.backoff(done + self._unkept.get(uid, 0), retry_after_s))
        until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.wall() + wait))
        log.debug("pod %s/%s delayed: requeue %d in %.1fs", namespace, name, done + 1, wait)
        self._post(
            uid,
            namespace,
            name,
            "Normal",
            "DelayedByPolicy",
            f"the scheduling policy delayed this pod; rlsched operator requeues it at {until} "
            f"(in {wait:.0f}s; requeue {done + 1} of {self.settings.max_attempts})",
        )

    def on_room(self, record: Mapping[str, Any]) -> None:
        """A ``room`` record (:mod:`rlsched.extender.refused`): filter refused the pod moments before its
        watch saw room free where the pod fits, and kube-scheduler, which saw that departure first,
        will not retry the pod for it. Requeued after ``initialS`` by a bump of
        :data:`ROOM_ANNOTATION`, at most :data:`ROOM_REQUEUES` times per pod (counted here; the
        extender cannot tell such a race from a refusal kube-scheduler retries anyway, so some of these
        are spare attempts). Apart from the delays' count: it spends none of ``maxAttempts`` and posts
        no event (nothing the policy did); a delay for the pod replaces it (:meth:`delayed`)."""
        if record.get("kind") != "room" or not self.settings.enabled:
            return
        pod = record.get("pod")
        uid = pod.get("uid") if isinstance(pod, Mapping) else None
        if not isinstance(uid, str) or not uid or uid in self._due or self._room.get(uid, 0) >= ROOM_REQUEUES:
            return
        known = self.lookup(uid)
        # Not _stopped: a pod the delays gave up on may still be requeued for room (apart from them).
        if known is None or uid in self._dropped or self._dropped_in[known.namespace] >= NAMESPACE_MEMORY:
            return
        wait = self._enqueue(uid, known.namespace, known.name, self.settings.initial_s)
        self._room_due.add(uid)
        log.info(
            "pod %s/%s: %s; requeued in %.1fs",
            known.namespace,
            known.name,
            str(record.get("reason") or "room freed after filter refused it")[:300],
            wait,
            extra={"event": "room_requeue", "pod": f"{known.namespace}/{known.name}"},
        )

    def _enqueue(self, uid: str, namespace: str, name: str, wait: float) -> float:
        """Schedule a requeue of ``uid`` in ``wait`` seconds; ``wait``. Everything that can raise comes
        before the heap changes: a half-scheduled pod would block the rest."""
        due = self.clock() + wait
        if not math.isfinite(due):
            raise ValueError(f"requeue time {due!r} of {namespace}/{name} is not finite")
        self._due[uid] = (due, namespace, name)
        heapq.heappush(self._heap, (due, uid))
        self._wake.set()
        return wait

    def sweep(self) -> int:
        """Schedule pending pods whose condition says "delayed" but that nothing scheduled."""
        added = 0
        now = self.clock()
        self._prune()
        for pod in self.pending():
            if not pod.delayed or pod.uid in self._due or self._stopped(pod.uid, pod.namespace):
                continue
            if pod.attempt >= self.settings.max_attempts:
                continue  # requeues ended (the annotation says so); a delay that finds it there tells once
            try:
                last = self._last.get(pod.uid)
                if last is not None and now - last < self.backoff(pod.attempt, pod.retry_after_s):
                    continue  # requeued recently: the scheduler has not re-evaluated it yet
                self.delayed(pod.uid, pod.namespace, pod.name, self._left_of(pod))
            except Exception:  # noqa: BLE001 - one bad pod must not keep the others from being scheduled
                self._failed(pod.uid, "scheduling the requeue of %s/%s failed", pod.namespace, pod.name)
                continue
            added += 1
        return added

    # -- the loop -----------------------------------------------------------------------------------
    async def run(self) -> None:
        # The first sweep soon after start: pods delayed while no operator was running.
        next_sweep = self.clock() + min(self.settings.sweep_interval_s, 3.0)
        while True:
            now = self.clock()
            if now >= next_sweep:
                try:
                    self.sweep()
                except Exception:  # noqa: BLE001 - the index may be mid-update; try next time
                    log.exception("requeue sweep failed")
                next_sweep = now + self.settings.sweep_interval_s
            await self.process_due()
            wait = next_sweep - self.clock()
            if self._heap:
                wait = min(wait, self._heap[0][0] - self.clock())
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=max(wait, 0.05))
            except TimeoutError:
                pass

    async def process_due(self) -> int:
        done = 0
        # "not due > now" rather than "due <= now": an entry that compares false both ways (nan) is
        # popped and dropped below (nan != nan) instead of blocking every pod behind it.
        while self._heap and not self._heap[0][0] > self.clock():
            due, uid = heapq.heappop(self._heap)
            entry = self._due.get(uid)
            if entry is None or entry[0] != due:
                continue
            del self._due[uid]
            try:
                await self._requeue(uid, entry[1], entry[2])
            except Exception:  # noqa: BLE001 - one bad pod must not stop the requeue of the others
                self._failed(uid, "requeue of %s/%s failed", entry[1], entry[2])
                self._remember_failure(uid)  # the sweep would bring it back, to fail again
                continue
            done += 1
        return done

    async def _requeue(self, uid: str, namespace: str, name: str) -> None:
        from .kube import KubeError

        if uid in self._room_due:
            self._room_due.discard(uid)
            await self._requeue_room(uid, namespace, name)
            return
        pod = self.lookup(uid)
        if pod is None:
            log.debug("pod %s/%s is no longer pending: no requeue", namespace, name)
            self._retries.pop(uid, None)
            return
        attempt = pod.attempt + 1
        try:
            await self.patch(pod.namespace, pod.name, uid, {self.settings.annotation: str(attempt)})
        except KubeError as exc:
            if exc.status in GONE:
                log.info("pod %s/%s not requeued: %s", namespace, name, exc)
            elif exc.status in REFUSED:
                self._drop(uid, "requeue of %s/%s refused (%s); not requeued again", namespace, name, exc)
            else:  # transient (5xx, 429, no answer) or not for good (401: a token about to be renewed)
                self._retry_later(uid, namespace, name, exc)
            return
        self._retries.pop(uid, None)
        self._unkept.pop(uid, None)
        self.requeued += 1
        _remember(self._last, uid, self.clock())
        log.info(
            "requeued delayed pod %s/%s (attempt %d of %d)",
            namespace,
            name,
            attempt,
            self.settings.max_attempts,
            extra={"event": "requeued", "pod": f"{namespace}/{name}", "attempt": attempt},
        )

    async def _requeue_room(self, uid: str, namespace: str, name: str) -> None:
        """A room requeue (:meth:`on_room`): one bump of :data:`ROOM_ANNOTATION`, not retried when it
        fails (kube-scheduler retries the pod at its next event all the same)."""
        from .kube import KubeError

        pod = self.lookup(uid)
        if pod is None:
            return
        n = self._room.get(uid, 0) + 1
        _remember(self._room, uid, n)
        try:
            await self.patch(pod.namespace, pod.name, uid, {ROOM_ANNOTATION: str(n)})
        except KubeError as exc:
            self._once(f"room:{uid}", logging.WARNING, "room requeue of %s/%s failed: %s", namespace, name, exc)
            return
        self.requeued += 1

    def _retry_later(self, uid: str, namespace: str, name: str, exc: Exception) -> None:
        """A transient failure: the same requeue again after a backoff, until it failed too often. Not for
        a pod deleted meanwhile (:meth:`forget` ran while the patch was on its way)."""
        self._room_due.discard(uid)  # a room requeue scheduled meanwhile gives way to this retry
        if self.lookup(uid) is None:
            self._retries.pop(uid, None)
            return
        tries = self._retries.pop(uid, 0) + 1
        if tries > MAX_TRANSIENT_RETRIES:
            self._drop(
                uid,
                "requeue of %s/%s failed %d times in a row (%s); dropped (kube-scheduler still retries the pod itself)",
                namespace,
                name,
                tries - 1,
                exc,
            )
            return
        delay = min(5.0 * 2 ** (tries - 1), 300.0)
        _remember(self._retries, uid, tries)
        self._once(
            f"retry:{uid}",
            logging.WARNING,
            "requeue of %s/%s failed (%s); retrying with backoff (logged once per pod)",
            namespace,
            name,
            exc,
        )
        self._due[uid] = (self.clock() + delay, namespace, name)
        heapq.heappush(self._heap, (self._due[uid][0], uid))

    def _drop(self, uid: str, message: str, *args: Any) -> None:
        """A requeue that failed for good: counted, logged once per pod, and the pod's requeues end
        (the sweep skips it until it is deleted; module docstring). A pod deleted meanwhile is not
        remembered (:meth:`forget` already ran: it would stay until the memory's cap pushed it out)."""
        self.failed += 1
        self._retries.pop(uid, None)
        self._remember_failure(uid)
        self._once(f"dropped:{uid}", logging.WARNING, message, *args)

    def _remember_failure(self, uid: str) -> None:
        """A pending pod's requeue failed for good: remembered, so that its requeues end, while its
        namespace and the whole memory have room (module docstring). A namespace that reaches
        :data:`NAMESPACE_MEMORY` pauses its own requeues; past :data:`MEMORY` in all, the failure is
        counted into the pod's backoff instead. A pod deleted or bound meanwhile is not remembered
        (:meth:`forget` may have run while the patch was on its way)."""
        pod = self.lookup(uid)
        if pod is None or uid in self._dropped:
            return
        namespace = pod.namespace
        if self._dropped_in[namespace] >= NAMESPACE_MEMORY:
            return  # the namespace pauses: nothing of it is scheduled, nothing more to remember
        if len(self._dropped) >= MEMORY:
            _remember(self._unkept, uid, self._unkept.get(uid, 0) + 1)
            if not self._told_full:
                self._told_full = True
                log.error(
                    "the requeues of %d pending pods failed for good (at most %d per namespace are remembered); "
                    "more such pods are not remembered: they are retried with backoff, each failure counted as "
                    "a requeue (then every %.0fs, requeue.maxS), until some of those pods are deleted or bound",
                    MEMORY,
                    NAMESPACE_MEMORY,
                    self.settings.max_s,
                )
            return
        self._dropped[uid] = namespace
        self._dropped_in[namespace] += 1
        self._unkept.pop(uid, None)
        if self._dropped_in[namespace] >= NAMESPACE_MEMORY:
            self._log_pauses()

    def _give_up(self, uid: str, namespace: str, name: str, done: int) -> None:
        """``RequeueGaveUp``, once per pod: not posted when the memory of the pods told is full (its
        annotation still says requeues ended; posting without remembering would repeat it on every delay)."""
        if not _keep(self._gave_up, uid):
            self._once(
                "gave-up-full",
                logging.WARNING,
                "more than %d pending pods were given up on; RequeueGaveUp is not posted for more until some "
                "are deleted or bound (their %s annotation says requeue.maxAttempts was reached)",
                MEMORY,
                self.settings.annotation,
            )
            return
        self.given_up += 1
        message = (
            f"the scheduling policy delayed this pod {done} times; rlsched operator stops requeueing it "
            f"(requeue.maxAttempts={self.settings.max_attempts}); kube-scheduler still retries it every 5 minutes"
        )
        log.warning("pod %s/%s: %s", namespace, name, message, extra={"event": "requeue_gave_up"})
        self._post(uid, namespace, name, "Warning", "RequeueGaveUp", message)

    def _failed(self, uid: str, message: str, *args: Any) -> None:
        """Count a pod whose scheduling or requeue raised, and log it (with the traceback) once per pod."""
        self.failed += 1
        self._once(f"failed:{uid}", logging.ERROR, message, *args, exc_info=True)

    def _post(self, uid: str, namespace: str, name: str, kind: str, reason: str, message: str) -> None:
        """An event on the pod, in the background (best effort: its failure is the event sink's to log)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called outside the operator's loop (tests): nothing to post on
            return
        ref = {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name, "uid": uid}
        task = loop.create_task(self.event(ref, kind, reason, message))
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    def wake(self) -> None:
        self._wake.set()

    @property
    def scheduled(self) -> int:
        return len(self._due)


class Rejections:
    """Pods the policy rejected: one ``RejectedByPolicy`` event and an ``rlsched.io/policy-rejected``
    annotation per pod, naming the policy's reason (from decision records, or from the pod's own
    PodScheduled message after an operator restart).

    An annotation rather than a pod condition: a condition needs ``pods/status`` patch, which would
    let the operator rewrite any status (a running pod's Ready condition, hence Service endpoints);
    the annotation needs only the pod patch the requeue uses anyway, which the chart's admission
    policy limits to ``rlsched.io/`` annotations. kube-scheduler's own PodScheduled condition already
    carries the reason ("rejected by policy: ...")."""

    ANNOTATION = REJECTED_ANNOTATION
    MAX_MESSAGE = 1024
    """Characters of the reason kept in the annotation (the event is cut at the same length)."""

    def __init__(
        self,
        patch: Patch,
        event: Event,
        memory: int = 50_000,
        lookup: Callable[[str], PendingPod | None] | None = None,
    ):
        """``lookup``: the pending pods of our scheduler by UID (kopf's index); a decision record about
        any other pod (bound, gone, or told before a restart) is then passed over."""
        self.patch, self.event, self.memory, self.lookup = patch, event, memory, lookup
        self._done: OrderedDict[str, None] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self.notified = 0

    def on_verdict(self, record: Mapping[str, Any]) -> None:
        if record.get("verdict") != "reject":
            return
        pod = record.get("pod") or {}
        uid = pod.get("uid", "")
        if self.lookup is not None and isinstance(uid, str):
            known = self.lookup(uid)
            if known is None or known.rejection_noted:
                return  # a pending pod not yet in the index comes back through its own watch event
        reason = str(record.get("reason") or "no reason given")
        self.rejected(uid, pod.get("namespace", ""), pod.get("name", ""), reason)

    def rejected(self, uid: str, namespace: str, name: str, reason: str) -> None:
        if not uid or uid in self._done:
            return
        self._done[uid] = None
        while len(self._done) > self.memory:
            self._done.popitem(last=False)
        task = asyncio.get_running_loop().create_task(self._notify(uid, namespace, name, reason))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _notify(self, uid: str, namespace: str, name: str, reason: str) -> None:
        from .kube import KubeError

        message = f"the scheduling policy rejected this pod: {reason}"[: self.MAX_MESSAGE]
        ref = {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name, "uid": uid}
        await self.event(ref, "Warning", "RejectedByPolicy", message)
        try:
            await self.patch(namespace, name, uid, {self.ANNOTATION: message})
        except KubeError as exc:
            log.warning("could not set the %s annotation on %s/%s: %s", self.ANNOTATION, namespace, name, exc)
        self.notified += 1
        log.info("pod %s/%s rejected by the policy: %s", namespace, name, reason, extra={"event": "pod_rejected"})

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
