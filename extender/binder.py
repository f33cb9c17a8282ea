"""Bind: reserve cards at once, then create the binding that records them on the pod.

1. The pod is looked up (filter's remembered decision, else the watch cache, else one GET).
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
from dataclasses import dataclass
from typing import Any, Callable

from rlsched.policy.feasibility import feasible_mask, infeasibility_reason

from .cache import ASSUMED, BOUND, UNCERTAIN, ClusterCache
from .kubeapi import ApiError
from .objects import ObjectError, PodInfo, assignment_annotations, pod_info
from .policy import PolicyEngine
from .settings import GpuConventions, KubeSettings

log = logging.getLogger("rlsched.extender.bind")


@dataclass
class BindResult:
    """What bind answers (``error`` "" on success) and what it did."""

    error: str
    node: str
    cards: tuple[int, ...] = ()
    milli: int = 0
    result: str = "ok"
    """ok | error | uncertain | duplicate."""


class Binder:
    """Reserve-then-write bind with idempotency by UID (module docstring)."""

    def __init__(self, cache: ClusterCache, engine: PolicyEngine, api: Any, gpu: GpuConventions, kube: KubeSettings,
                 remembered: Callable[[str], Any] | None = None):
        self.cache, self.engine, self.api, self.gpu, self.kube = cache, engine, api, gpu, kube
        self.remembered = remembered or (lambda uid: None)
        """uid → filter's remembered decision (``verbs.DecisionMemory.get``), or None."""
        self.lock = asyncio.Lock()
        self._inflight: dict[str, tuple[str, asyncio.Future]] = {}

    async def bind(self, uid: str, namespace: str, name: str, node: str) -> BindResult:
        inflight = self._inflight.get(uid)
        if inflight is not None:
            other, future = inflight
            if other != node:
                return BindResult(f"pod {namespace}/{name} is already being bound to node {other}", node, result="error")
            result = await asyncio.shield(future)
            return BindResult(result.error, node, result.cards, result.milli, "duplicate")
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._inflight[uid] = (node, future)
        try:
            result = await self._bind(uid, namespace, name, node)
        except Exception as exc:  # noqa: BLE001 - a bug must not leave the future hanging
            log.exception("bind of %s/%s failed unexpectedly", namespace, name)
            entry = self.cache.pods.get(uid)
            if entry is not None and entry.status == ASSUMED:
                self.cache.forget(uid)
            result = BindResult(f"internal error while binding: {type(exc).__name__}: {exc}", node, result="error")
        finally:
            self._inflight.pop(uid, None)
        future.set_result(result)
        return result

    async def _bind(self, uid: str, namespace: str, name: str, node: str) -> BindResult:
        key = f"{namespace}/{name}"
        existing = self.cache.pods.get(uid)
        if existing is not None and existing.node != node and existing.status == BOUND:
            return BindResult(f"pod {key} is already bound to node {existing.node}", node, result="error")
        if existing is not None and existing.node == node and existing.status == BOUND:
            return BindResult("", node, existing.cards, existing.spec.gpu_milli if existing.spec.num_gpu else 0, "duplicate")
        info = await self._pod(uid, namespace, name)
        if isinstance(info, BindResult):
            return info
        if info.node_name:
            if info.node_name == node:
                return BindResult("", node, info.cards or (), 0, "duplicate")
            return BindResult(f"pod {key} is already bound to node {info.node_name}", node, result="error")
        if info.spec is None:
            return BindResult(f"pod {key}: {info.problem}", node, result="error")
        spec = info.spec
        # -- the critical section: choose, check and reserve cards without yielding ---------------
        async with self.lock:
            reused = existing is not None and existing.node == node and existing.status in (ASSUMED, UNCERTAIN)
            if reused:
                entry = existing  # a retry after an unknown outcome: keep the reservation
                entry.status, entry.since = ASSUMED, self.cache.clock()
            else:
                if existing is not None:
                    self.cache.forget(uid)
                state = self.cache.state
                if state is None or node not in state.index:
                    return BindResult(f"node {node} is not in the extender's cache (not yet seen by the watch, or deleted)",
                                      node, result="error")
                idx = state.index[node]
                req = state.request(spec)
                if not feasible_mask(state, req)[idx]:
                    why = infeasibility_reason(state, req, idx)
                    return BindResult(f"pod {key} no longer fits node {node}: {why}", node, result="error")
                entry = None
                cards = self._remembered_cards(uid, info, node)
                if cards is not None:  # filter's choice, if its cards are still free
                    entry = self.cache.add(uid, key, node, spec, cards, ASSUMED, exact=True)
                    if entry.placement is None:
                        self.cache.forget(uid)
                        entry = None
                if entry is None:
                    cards = self.engine.cards_on(state, self.cache.tiebreak, req, idx)
                    if cards is None:  # pragma: no cover - feasible_mask said it fits
                        return BindResult(f"pod {key} no longer fits node {node}", node, result="error")
                    entry = self.cache.add(uid, key, node, spec, cards, ASSUMED, exact=True)
                    if entry.placement is None:
                        self.cache.forget(uid)
                        return BindResult(f"pod {key} cannot take cards {list(cards)} on node {node}: {entry.problem}",
                                          node, result="error")
        cards = entry.cards
        milli = spec.gpu_milli if spec.num_gpu else 0
        # -- the write: one Binding that carries the card annotations ---------------------------
        annotations = assignment_annotations(self.gpu, node, cards, milli) if spec.num_gpu else None
        try:
            await self.api.create_binding(namespace, name, uid, node, self.kube.write_timeout_s, annotations)
        except ApiError as exc:
            return await self._failed(uid, key, node, cards, milli, exc)
        entry.bind_done = True
        log.info("bound %s to %s cards %s", key, node, list(cards),
                 extra={"event": "bound", "pod": key, "uid": uid, "node": node, "cards": list(cards)})
        return BindResult("", node, cards, milli)

    async def _pod(self, uid: str, namespace: str, name: str) -> PodInfo | BindResult:
        key = f"{namespace}/{name}"
        remembered = self.remembered(uid)
        if remembered is not None:
            return remembered.info
        info = self.cache.pending.get(uid)
        if info is not None:
            return info
        try:
            pod = await self.api.get_pod(namespace, name, self.kube.write_timeout_s)
        except ApiError as exc:
            if exc.status == 404:
                return BindResult(f"pod {key} not found (deleted?)", "", result="error")
            return BindResult(f"cannot read pod {key}: {exc}", "", result="error")
        try:
            info = pod_info(pod, self.gpu, "pod")
        except ObjectError as exc:
            return BindResult(f"pod {key} unreadable: {exc}", "", result="error")
        if info.uid != uid:
            return BindResult(f"pod {key} has UID {info.uid}, not {uid} (recreated?)", "", result="error")
        return info

    def _remembered_cards(self, uid: str, info: PodInfo, node: str) -> tuple[int, ...] | None:
        remembered = self.remembered(uid)
        if remembered is None or remembered.epoch != self.cache.epoch:
            return None
        decision = remembered.outcome.decision
        state = self.cache.state
        if decision is None or state is None or state.names[decision.node] != node:
            return None
        return decision.cards

    async def _failed(self, uid: str, key: str, node: str, cards: tuple[int, ...], milli: int,
                      exc: ApiError) -> BindResult:
        entry = self.cache.pods.get(uid)
        if entry is not None and entry.status == BOUND and entry.node == node:
            return BindResult("", node, cards, milli)  # the watch already saw it bound there
        if exc.status == 409 and "already" in exc.message:
            # Already assigned: success when it is ours (a retried bind), else report where it went.
            try:
                current = pod_info(await self.api.get_pod(*key.split("/", 1), self.kube.write_timeout_s), self.gpu, "pod")
            except (ApiError, ObjectError):
                current = None
            if current is not None and current.uid == uid and current.node_name == node:
                return BindResult("", node, cards, milli)
            self.cache.forget(uid)
            where = f" to node {current.node_name}" if current is not None and current.node_name else ""
            return BindResult(f"pod {key} is already bound{where}: {exc.message}", node, result="error")
        if exc.status == 0:  # timeout or connection lost: the binding may exist
            if entry is not None:
                entry.status, entry.since = UNCERTAIN, self.cache.clock()
            log.warning("binding %s to %s: outcome unknown (%s); cards stay reserved for %.0f s unless the watch says otherwise",
                        key, node, exc, self.kube.assumed_ttl_s, extra={"event": "bind_uncertain", "pod": key, "node": node})
            return BindResult(f"binding pod {key} to {node}: {exc.message}; cards stay reserved for "
                              f"{self.kube.assumed_ttl_s:.0f} s", node, cards, milli, "uncertain")
        self.cache.forget(uid)
        what = {404: "pod not found (deleted?)", 409: "conflict (pod recreated or changed)",
                422: "rejected (pod recreated under the same name?)", 403: "forbidden (check RBAC: pods/binding create)"}
        hint = what.get(exc.status, "")
        log.warning("binding %s to %s failed: %s", key, node, exc, extra={"event": "bind_failed", "pod": key, "node": node})
        return BindResult(f"binding pod {key} to {node} failed: {exc}{' — ' + hint if hint else ''}", node, result="error")

