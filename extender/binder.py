"""Bind: reserve cards at once, then create the binding that records them on the pod.

Bind trusts nobody: anything that can reach the verb could otherwise place any pod anywhere (a
forged filter followed by a bind once put an 8-GPU pod on a node whose cards were all held).

1. The names are checked (:mod:`rlsched.extender.names`) before any API path is built; the pod's
   *current* spec is looked up — the watch cache by UID (namespace and name must agree), else one
   GET, whose UID must match. Bind refuses a pod whose ``schedulerName`` is not ours, and takes the
   request (cpu, memory, cards, model) and the placement rules from that spec only — never from the
   bind request, never from filter's memory, which is a *hint* for the card choice, used only when
   its pod UID and resourceVersion match the current pod's.
   The node must be in the cache, and the pod must tolerate its NoSchedule/NoExecute taints and
   match its nodeSelector and required node affinity (:mod:`rlsched.extender.node_rules`).
2. Under the lock, synchronously: the cards are chosen (the decision's cards when kube-scheduler
   picked the decision's node and they are still free, else the serving scorer's card rule on that
   node), checked and placed in the ClusterState as an *assumed* pod — from this instant every filter
   sees them taken, so two binds can never get the same card.
3. One write: ``pods/binding`` (UID-guarded) carrying ``rlsched.io/gpu-cards`` (+ milli and node) as
   the Binding's annotations, which kube-apiserver copies onto the pod in the same update that sets
   ``spec.nodeName`` — the assignment and the node land together or not at all, and a bind costs one
   API write, not two (docs/benchmarks.md: 2.5× the throughput on this machine).
4. A definite failure releases the reservation; an unknown outcome (a write timed out) keeps it as
   *uncertain* until the watch shows the pod bound, or a TTL passes.

Idempotent by pod UID: a second call for the same pod and node joins the one in flight or succeeds
at once if already bound there; for another node it fails with a message saying where the pod went.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlsched.policy.feasibility import fits_on, infeasibility_reason

from .cache import ASSUMED, BOUND, RESERVED, UNCERTAIN, ClusterCache
from .kubeapi import NOT_SENT, ApiError
from .names import InvalidName, check_node_name, check_pod_ref, check_uid
from .node_rules import NO_RULES, PodRules, pod_rules, refusal
from .objects import PodInfo, assignment_annotations, pod_info
from .policy import PolicyEngine
from .rejections import describe
from .settings import GpuConventions, KubeSettings

if TYPE_CHECKING:
    from .verbs import Remembered

log = logging.getLogger("rlsched.extender.bind")

READ_TIMEOUT_S = 2.0
"""The longest one GET of a pod may take in a verb (bind's, when the watch has not delivered the pod or
its write met a conflict; preempt's preemptor, read while kube-scheduler's scheduling cycle waits)."""
MIN_CALL_S = 0.25
"""The least time an API call of bind is given, even when its deadline is nearer (a call given none
would be refused by the client before it is sent)."""


@dataclass
class BindResult:
    """What bind answers (``error`` "" on success) and what it did."""

    error: str
    node: str
    cards: tuple[int, ...] = ()
    milli: int = 0
    result: str = "ok"
    """ok | error | uncertain | duplicate | refused (the pod is not ours, or may not go on the node, or the
    request names no real object)."""
    write_s: float | None = None
    """Seconds the ``pods/binding`` write took as the extender saw it (request sent → answer read);
    None when bind made no write. Set beside kube-apiserver's own handler latency, it says how much
    of a bind is the API server and how much the way there and back."""


class Binder:
    """Reserve-then-write bind with idempotency by UID (module docstring)."""

    def __init__(
        self,
        cache: ClusterCache,
        engine: PolicyEngine,
        api: Any,
        gpu: GpuConventions,
        kube: KubeSettings,
        remembered: Callable[[str], Remembered | None] | None = None,
    ):
        self.cache, self.engine, self.api, self.gpu, self.kube = cache, engine, api, gpu, kube
        self.remembered = remembered or (lambda uid: None)
        """uid → filter's remembered decision (``verbs.DecisionMemory.get``), or None: a hint for the
        cards only, trusted when its resourceVersion is the current pod's."""
        self.lock = asyncio.Lock()
        self._inflight: dict[str, tuple[str, asyncio.Future[BindResult]]] = {}

    async def bind(self, uid: str, namespace: str, name: str, node: str) -> BindResult:
        try:
            check_uid(uid)
            check_pod_ref(namespace, name)
            check_node_name(node)
        except InvalidName as exc:
            return BindResult(f"refused: {exc}", node, result="refused")
        inflight = self._inflight.get(uid)
        if inflight is not None:
            other, pending = inflight
            if other != node:
                return BindResult(
                    f"pod {namespace}/{name} is already being bound to node {other}", node, result="error"
                )
            result = await asyncio.shield(pending)
            return BindResult(result.error, node, result.cards, result.milli, "duplicate")
        future: asyncio.Future[BindResult] = asyncio.get_running_loop().create_future()
        self._inflight[uid] = (node, future)
        try:
            result = await self._bind(uid, namespace, name, node)
        except Exception as exc:  # noqa: BLE001 - a bug must not leave the future hanging
            log.exception("bind of %s/%s failed unexpectedly", namespace, name)
            entry = self.cache.pods.get(uid)
            if entry is not None and entry.status == ASSUMED:
                self.cache.release(uid)
            result = BindResult(f"internal error while binding: {type(exc).__name__}: {exc}", node, result="error")
        finally:
            self._inflight.pop(uid, None)
        future.set_result(result)
        return result

    async def _bind(self, uid: str, namespace: str, name: str, node: str) -> BindResult:
        key = f"{namespace}/{name}"
        existing = self.cache.pods.get(uid)
        if existing is not None and existing.key != key:
            return BindResult(f"refused: pod {key} does not have UID {uid}", node, result="refused")
        if existing is not None and existing.bind_done and existing.status == BOUND:  # ours, and the watch saw it
            if existing.node != node:
                return BindResult(f"pod {key} is already bound to node {existing.node}", node, result="error")
            return BindResult(
                "", node, existing.cards, existing.spec.gpu_milli if existing.spec.num_gpu else 0, "duplicate"
            )
        # One deadline for the bind's API calls together: kube-scheduler waits for the answer for its
        # httpTimeout (docs/extender.md, "Bind").
        deadline = time.monotonic() + self.kube.write_timeout_s
        current = await self.current_pod(uid, namespace, name, min(READ_TIMEOUT_S, _left(deadline)))
        if isinstance(current, BindResult):
            return current
        info, rules = current
        ours = self.kube.scheduler_name
        if info.scheduler_name != ours:
            return BindResult(
                f"refused: pod {key} is not scheduled by {ours}; this extender binds only pods whose "
                f"spec.schedulerName is {ours}",
                node,
                result="refused",
            )
        if info.node_name:
            if info.node_name == node:
                return BindResult("", node, info.cards or (), 0, "duplicate")
            return BindResult(f"pod {key} is already bound to node {info.node_name}", node, result="error")
        if info.spec is None:
            return BindResult(f"pod {key}: {info.problem}", node, result="error")
        if node not in self.cache.nodes:
            return self._not_cached(node)
        facts = self.cache.node_facts.get(node)
        if facts is None:
            return BindResult(
                f"refused: the taints of node {node} could not be read (see the extender's log)", node, result="refused"
            )
        why = refusal(rules, facts)
        if why:
            return BindResult(f"refused: pod {key} may not run on node {node}: {why}", node, result="refused")
        spec = info.spec
        # -- the critical section: choose, check and reserve cards without yielding ---------------
        async with self.lock:
            self.cache.state  # noqa: B018 - rebuild now if the nodes changed: placements below are current
            existing = self.cache.pods.get(uid)  # may have changed while the pod was read
            if (
                existing is not None
                and existing.node == node
                and existing.status in (ASSUMED, UNCERTAIN, RESERVED)
                and existing.spec == spec
                and existing.placement is not None  # it holds its cards (a shrunk node may not)
                and self._model_allows(spec, node)  # the node was not relabelled meanwhile
            ):
                entry = existing  # filter's reservation, or a retry after an unknown outcome: keep it
                # A binding that may have been written (an unknown outcome) may run: counted so.
                entry.bind_done = entry.bind_done or entry.status == UNCERTAIN
                entry.status, entry.since = ASSUMED, self.cache.clock()
            else:
                # An earlier binding to this node that may have been written (an unknown outcome), while
                # the entry cannot be kept as it is (the spec changed, the node shrank or was relabelled).
                earlier_may_stand = (
                    existing is not None
                    and existing.node == node
                    and (existing.bind_done or existing.status == UNCERTAIN)
                )
                if existing is not None:
                    if existing.status == BOUND:
                        return BindResult(f"pod {key} is already bound to node {existing.node}", node, result="error")
                    if existing.status in (ASSUMED, UNCERTAIN) and existing.node != node:
                        # An earlier bind of this pod to another node succeeded (kube-scheduler may not
                        # know) or may have: its cards stay held until the watch says where it went.
                        return BindResult(
                            f"pod {key} was bound to node {existing.node} by an earlier bind "
                            f"(or its outcome is not known yet); not binding it to {node}",
                            node,
                            result="error",
                        )
                    if earlier_may_stand and existing.status == ASSUMED and existing.bind_done:
                        # Our earlier binding to this node was written; the watch has not shown it yet.
                        held = existing.spec.gpu_milli if existing.spec.num_gpu else 0
                        return BindResult("", node, existing.cards, held, "duplicate")
                    if earlier_may_stand:
                        # Its cards stay held (uncertain) until the watch tells or the TTL passes; a new
                        # entry here would free them while that binding may stand.
                        if existing.spec != spec:
                            changed = "the pod's request changed"
                        elif existing.placement is None:
                            changed = "the node's cards changed"
                        else:
                            changed = "the node's GPU model is not one the pod allows now"
                        return BindResult(
                            f"pod {key}: an earlier binding to node {node} may have been written (its outcome "
                            f"is not known yet) and {changed}; not binding it again until that is known",
                            node,
                            result="error",
                        )
                    self.cache.release(uid)
                state = self.cache.state
                if state is None or node not in state.index:
                    return self._not_cached(node)
                idx = state.index[node]
                req = state.request(spec)
                if not fits_on(state, req, idx):  # one node: no mask over all of them
                    why = infeasibility_reason(state, req, idx)
                    return BindResult(f"pod {key} no longer fits node {node}: {why}", node, result="error")
                hinted = None
                cards = self._hinted_cards(uid, info, node)
                if cards is not None:  # filter's choice, if its cards are still free
                    hinted = self.cache.add(uid, key, node, spec, cards, ASSUMED, exact=True)
                    if hinted.placement is None:
                        self.cache.release(uid)
                        hinted = None
                if hinted is not None:
                    entry = hinted
                else:
                    cards = self.engine.cards_on(state, self.cache.tiebreak, req, idx)
                    if cards is None:  # pragma: no cover - fits_on said it fits
                        return BindResult(f"pod {key} no longer fits node {node}", node, result="error")
                    entry = self.cache.add(uid, key, node, spec, cards, ASSUMED, exact=True)
                    if entry.placement is None:
                        self.cache.release(uid)
                        return BindResult(
                            f"pod {key} cannot take cards {list(cards)} on node {node}: {entry.problem}",
                            node,
                            result="error",
                        )
        cards = entry.cards
        milli = spec.gpu_milli if spec.num_gpu else 0
        # -- the write: one Binding that carries the card annotations ---------------------------
        annotations = assignment_annotations(self.gpu, node, cards, milli) if spec.num_gpu else None
        started = time.perf_counter()
        try:
            await self.api.create_binding(namespace, name, uid, node, _left(deadline), annotations)
        except ApiError as exc:
            write_s = time.perf_counter() - started
            failed = await self._failed(uid, key, node, cards, milli, exc, min(READ_TIMEOUT_S, _left(deadline)))
            failed.write_s = write_s
            return failed
        write_s = time.perf_counter() - started
        entry.bind_done = True
        self.cache.count_running(uid)
        log.info(
            "bound %s to %s cards %s",
            key,
            node,
            list(cards),
            extra={"event": "bound", "pod": key, "uid": uid, "node": node, "cards": list(cards)},
        )
        return BindResult("", node, cards, milli, write_s=write_s)

    async def current_pod(
        self, uid: str, namespace: str, name: str, timeout: float = READ_TIMEOUT_S
    ) -> tuple[PodInfo, PodRules] | BindResult:
        """The pod as it is now, with its placement rules: the watch cache when it holds this pod
        (UID, namespace and name agreeing), else one GET (at most ``timeout`` s) whose UID must match.
        Never the caller's copy.

        Errors name only what the caller sent: another object's data (a different UID under that
        name, say) is not repeated back."""
        key = f"{namespace}/{name}"
        try:
            check_pod_ref(namespace, name)
        except InvalidName as exc:
            return BindResult(f"refused: {exc}", "", result="refused")
        info = self.cache.pending.get(uid)
        rules = self.cache.pod_rules.get(uid)
        if info is not None and rules is not None and info.key == key:
            return info, rules
        if self.api is None:
            return BindResult(f"pod {key} is not in the extender's cache", "", result="error")
        try:
            pod = await self.api.get_pod(namespace, name, timeout)
        except ApiError as exc:
            if exc.status == 404:
                return BindResult(f"pod {key} not found (deleted?)", "", result="error")
            return BindResult(f"cannot read pod {key}: {exc}", "", result="error")
        try:
            info = pod_info(pod, self.gpu, "pod")
        except Exception as exc:  # noqa: BLE001 - whatever the pod holds, the answer is a refusal, not a 500
            return BindResult(f"refused: pod {key} cannot be read: {describe(exc)}", "", result="refused")
        if info.uid != uid or info.key != key:
            return BindResult(
                f"refused: pod {key} does not have UID {uid} (deleted and recreated?)", "", result="refused"
            )
        if info.node_name:
            return info, NO_RULES  # bound already: the rules no longer matter
        try:
            rules = pod_rules(pod)
        except Exception as exc:  # noqa: BLE001
            return BindResult(
                f"refused: pod {key}'s placement rules cannot be read: {describe(exc)}", "", result="refused"
            )
        return info, rules

    def _model_allows(self, spec: Any, node: str) -> bool:
        """Whether the pod's card models include ``node``'s now (False when the node is not in the state)."""
        state = self.cache.state
        idx = state.index.get(node) if state is not None else None
        return idx is not None and state is not None and bool(state.request(spec).model_ok[state.model_id[idx]])

    def _not_cached(self, node: str) -> BindResult:
        """The answer for a node the cache does not hold: one the watch delivered but could not read
        is refused with the reason (binding there would fail until the node changes), another one is
        an error (not yet seen by the watch, or deleted)."""
        reason = self.cache.rejected_nodes.get(node)
        if reason is not None:
            return BindResult(f"refused: node {node} was rejected by the extender: {reason}", node, result="refused")
        return BindResult(
            f"node {node} is not in the extender's cache (not yet seen by the watch, or deleted)", node, result="error"
        )

    def _hinted_cards(self, uid: str, info: PodInfo, node: str) -> tuple[int, ...] | None:
        """Filter's cards for this node, when its memory is about this very pod version."""
        remembered = self.remembered(uid)
        state = self.cache.state  # may rebuild (a new epoch): read it before comparing epochs
        if remembered is None or state is None or remembered.epoch != self.cache.epoch:
            return None
        if remembered.info.resource_version != info.resource_version or remembered.info.key != info.key:
            return None  # a forged or stale filter: not this pod as it is now
        decision = remembered.outcome.decision
        if decision is None or state.names[decision.node] != node:
            return None
        return decision.cards

    async def _failed(
        self, uid: str, key: str, node: str, cards: tuple[int, ...], milli: int, exc: ApiError, read_timeout_s: float
    ) -> BindResult:
        entry = self.cache.pods.get(uid)
        if entry is not None and entry.status == BOUND:  # the watch has seen it bound: that is what holds
            if entry.node == node:
                return BindResult("", node, cards, milli)
            return BindResult(f"pod {key} is already bound to node {entry.node}: {exc.message}", node, result="error")
        if exc.status == 409 and "already" in exc.message:
            # Already assigned: success when it is ours (a retried bind), else report where it went.
            try:
                current = pod_info(await self.api.get_pod(*key.split("/", 1), read_timeout_s), self.gpu, "pod")
            except Exception:  # noqa: BLE001 - unreadable or gone: report the conflict as it is
                current = None
            if current is not None and current.uid == uid and current.node_name == node:
                entry = self.cache.pods.get(uid)
                if entry is not None and entry.status != BOUND:
                    entry.bind_done = True  # bound: a relist that misses it may now drop it
                return BindResult("", node, cards, milli)
            if current is not None and current.uid == uid and current.node_name:
                self.cache.observe(current)  # bound elsewhere: hold what it holds there, not nothing
            elif current is None:
                # Bound somewhere, perhaps here by an earlier bind: hold the cards until the watch tells.
                entry = self.cache.pods.get(uid)
                if entry is not None and entry.status != BOUND:
                    entry.status, entry.since = UNCERTAIN, self.cache.clock()
                    self.cache.count_running(uid)
            else:
                self.cache.forget(uid)  # another pod under this name now: this one's cards are free
            where = f" to node {current.node_name}" if current is not None and current.node_name else ""
            return BindResult(f"pod {key} is already bound{where}: {exc.message}", node, result="error")
        never_sent = exc.reason == NOT_SENT and not (entry is not None and entry.bind_done)
        if (exc.status == 0 or exc.status >= 500) and not never_sent:
            # Timeout, connection lost, or a server-side error (etcd timed out, a proxy's 502/504 after
            # forwarding the write): the binding may exist, so its cards stay held until the watch
            # tells. A 4xx (429 included) is a definite no, and so is a write that was never sent —
            # unless an earlier bind of this pod may have written one (bind_done on a retry).
            if entry is not None:
                entry.status, entry.since = UNCERTAIN, self.cache.clock()
                self.cache.count_running(uid)
            log.warning(
                "binding %s to %s: outcome unknown (%s); cards stay reserved for %.0f s "
                "unless the watch says otherwise",
                key,
                node,
                exc,
                self.kube.assumed_ttl_s,
                extra={"event": "bind_uncertain", "pod": key, "node": node},
            )
            return BindResult(
                f"binding pod {key} to {node}: {exc.message}; cards stay reserved for {self.kube.assumed_ttl_s:.0f} s",
                node,
                cards,
                milli,
                "uncertain",
            )
        self.cache.release(uid)
        what = {
            404: "pod not found (deleted?)",
            409: "conflict (pod recreated or changed)",
            422: "rejected (pod recreated under the same name?)",
            403: "forbidden (check RBAC: pods/binding create)",
        }
        hint = what.get(exc.status, "")
        log.warning(
            "binding %s to %s failed: %s", key, node, exc, extra={"event": "bind_failed", "pod": key, "node": node}
        )
        return BindResult(
            f"binding pod {key} to {node} failed: {exc}{' — ' + hint if hint else ''}", node, result="error"
        )


def _left(deadline: float) -> float:
    """Seconds until ``deadline`` (``time.monotonic()``), at least :data:`MIN_CALL_S`."""
    return max(deadline - time.monotonic(), MIN_CALL_S)
