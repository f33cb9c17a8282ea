"""The four verbs over the cache and the policy — no HTTP here (:mod:`rlsched.extender.app` serves them).

Filter makes the decision (feasibility → policy or fallback → node and cards) and remembers it per pod
UID and resourceVersion; prioritize and bind reuse it. With ``topK`` > 0 filter keeps only the
policy's top K feasible nodes; ``topK: 1`` hands kube-scheduler exactly one node, which it then binds
without running any score plugin or prioritize (docs/extender.md, "Decisions that survive").

Filter and prioritize judge the pod kube-scheduler sends and leave taints, nodeSelector and node
affinity to kube-scheduler's own plugins, which ran first. Bind and preempt change the cluster, so
they trust no caller: they read the pod from the watch cache or the API server (:mod:`.binder`), and
filter's memory is only a hint for them. A pod whose spec cannot be read is answered unschedulable
by filter (every node unresolvable, with the reason), never a 5xx.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rlsched.policy.cluster import LOAD_METRICS, ClusterState, PodRequest
from rlsched.policy.delay_head import MAX_HOLDS_PER_POD
from rlsched.policy.feasibility import feasible_mask, fits_on_cards, infeasibility_reason, unresolvable_mask
from rlsched.policy.resources import MILLI_PER_CARD

from .binder import Binder, BindResult
from .cache import ASSUMED, RESERVED, UNCERTAIN, ClusterCache, Entry, fit_again, place_nominated
from .decision_ring import DecisionRing
from .names import InvalidName, check_node_name, check_pod_ref, check_uid
from .objects import ObjectError, PodInfo, pod_info
from .policy import Outcome, PolicyEngine, Verdict
from .refused import RefusedPods
from .rejections import describe
from .settings import ExtenderSettings
from .wire import BadRequest, BindingArgs, ExtenderArgs, PreemptionArgs

log = logging.getLogger("rlsched.extender.verbs")


class UnreadablePod(BadRequest):
    """The pod's spec cannot be read: filter answers it unschedulable, the other verbs 400."""


MAX_EXTENDER_PRIORITY = 10
"""extenderv1.MaxExtenderPriority: prioritize scores are integers 0..10."""

NODE_NAMES_SLACK = 1000
"""A request may name at most 2 × the nodes in the cache + this many nodes. kube-scheduler sends the
nodes it found feasible, each once; a few more than the cache knows is a watch that lags, far more is
a broken or hostile caller, whose list would otherwise be answered with one reason per name."""

UNKNOWN_NODE = "not in the extender's cache yet (its watch lags); considered once the watch delivers it"
"""The reason for a node name the cache does not hold: one short sentence, sent once per such name."""

REJECTED_NODE = "node rejected by the extender: "
"""The start of the reason for a node the watch delivered but the extender could not read (its short
reason follows): unresolvable, as no retry helps until the node changes."""

HELD_FOR_NOMINATED = "its room is kept for a pod that preemption nominated to it"
"""Added to the reason of a node that fits the pod but for the pods nominated to it (filter counts
them there, as kube-scheduler's own filters do)."""

RELIST_RECHECK_S = 0.05
"""How soon the room check looks again while a relist is half applied (rlsched.extender.refused)."""

MAX_REASON_CHARS = 256
"""A reason copied to every node of the answer (an unreadable pod) is cut to this length."""


@dataclass
class Remembered:
    """Filter's decision for one pod, reused by prioritize and bind."""

    info: PodInfo
    epoch: int
    outcome: Outcome
    at: float
    kept: list[str] | None = None
    """The names filter kept (prioritize usually gets exactly these)."""
    kept_idx: np.ndarray | None = None


class HoldCounts:
    """The holds served to each pod (by UID, the most recent MAX_PODS pods): how many, and until when
    the last one runs. A delay while a hold runs is the same hold again (kube-scheduler retries a pod
    on every cluster event, long before the hold's end); after MAX_HOLDS_PER_POD holds the pod is
    placed at its next decision, as the simulator the delay was trained in does — a cluster that stays
    full would otherwise hold it for good. A restart forgets them."""

    MAX_PODS = 8192

    def __init__(self) -> None:
        self._holds: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def get(self, uid: str) -> int:
        return self._holds.get(uid, (0, 0.0))[0]

    def admit(self, uid: str, now: float, hold_s: float) -> float | None:
        """The seconds from ``now`` the hold served for a delay of ``hold_s`` decided for ``uid`` runs:
        what is left of the last hold while it runs (the same hold: not counted again, and its end
        stays where it was), else ``hold_s`` for a new hold while fewer than MAX_HOLDS_PER_POD were
        served; None when that many were (the pod is placed now)."""
        count, until = self._holds.get(uid, (0, 0.0))
        if count and now < until:
            return until - now
        if count >= MAX_HOLDS_PER_POD:
            return None
        self._holds[uid] = (count + 1, now + hold_s)
        self._holds.move_to_end(uid)
        while len(self._holds) > self.MAX_PODS:
            self._holds.popitem(last=False)
        return hold_s

    def forget(self, uid: str) -> None:
        self._holds.pop(uid, None)


class DecisionMemory:
    """Recent decisions by pod UID: bounded, expiring."""

    def __init__(self, ttl_s: float, size: int = 8192, clock: Callable[[], float] = time.monotonic):
        self.ttl_s, self.size, self.clock = ttl_s, size, clock
        self._items: OrderedDict[str, Remembered] = OrderedDict()

    def put(self, uid: str, item: Remembered) -> None:
        """Remember ``item``; the oldest entries go when there are more than ``size``, and expired
        ones from the front at once: each pins its decision's arrays over the feasible nodes (~24
        bytes a node), and pods filtered but never bound by us (deleted, bound elsewhere, failed by a
        later plugin) kept 8,192 of them, ~0.2 GB at 1,000 nodes, until the cap pushed them out."""
        items = self._items
        items[uid] = item
        items.move_to_end(uid)
        while len(items) > self.size:
            items.popitem(last=False)
        now = self.clock()
        while items:
            first = next(iter(items.values()))
            if now - first.at <= self.ttl_s:
                break
            items.popitem(last=False)

    def get(self, uid: str, resource_version: str | None = None) -> Remembered | None:
        item = self._items.get(uid)
        if item is None:
            return None
        if self.clock() - item.at > self.ttl_s or (
            resource_version is not None and item.info.resource_version != resource_version
        ):
            return None
        return item

    def pop(self, uid: str) -> None:
        self._items.pop(uid, None)

    def __len__(self) -> int:
        return len(self._items)


class ReasonMemo:
    """Filter reasons per node for one request shape, recomputed only for nodes that changed.

    ``infeasibility_reason`` is a Python call per node (≈1–3 µs); with thousands of infeasible nodes
    per filter that would dominate, so rows are cached and refreshed by ``node_version``.
    """

    def __init__(self, size: int = 64):
        self.size = size
        self._memo: OrderedDict[tuple[Any, ...], tuple[int, np.ndarray, np.ndarray]] = OrderedDict()

    def reasons(self, state: ClusterState, epoch: int, req: PodRequest, nodes: np.ndarray) -> np.ndarray:
        """Object array of reasons aligned with ``nodes``."""
        key = (req.cpu_milli, req.memory_mib, req.num_gpu, req.gpu_milli, req.model_ok.tobytes())
        hit = self._memo.get(key)
        if hit is None or hit[0] != epoch:
            hit = (epoch, np.full(state.num_nodes, -1, dtype=np.int64), np.full(state.num_nodes, "", dtype=object))
            self._memo[key] = hit
            while len(self._memo) > self.size:
                self._memo.popitem(last=False)
        self._memo.move_to_end(key)
        _, versions, texts = hit
        stale = nodes[versions[nodes] != state.node_version[nodes]]
        for n in stale.tolist():
            texts[n] = infeasibility_reason(state, req, n, detail=False)
        versions[stale] = state.node_version[stale]
        reasons: np.ndarray = texts[nodes]
        return reasons


class Extender:
    """The verbs. One instance per server; tests build it with fakes."""

    def __init__(
        self,
        cache: ClusterCache,
        engine: PolicyEngine,
        binder: Binder | None,
        ring: DecisionRing,
        settings: ExtenderSettings,
        metrics: Any = None,
        clock: Callable[[], float] = time.time,
    ):
        self.cache, self.engine, self.binder, self.ring = cache, engine, binder, ring
        self.settings, self.metrics, self.clock = settings, metrics, clock
        self.memory = DecisionMemory(settings.decision_cache_ttl_s)
        self.holds = HoldCounts()
        self.reason_memo = ReasonMemo()
        self._names_key: tuple[int, int] | None = None
        self._names_idx: np.ndarray | None = None
        self._names_list: list[str] | None = None
        self._names_cand: np.ndarray | None = None
        self._names_arr = np.array([], dtype=object)
        self._names_arr_state: ClusterState | None = None
        if binder is not None:
            binder.remembered = self.memory.get
        self.counts: dict[str, int] = {}
        self._shadow_tasks: set[Any] = set()
        self.refused = RefusedPods(cache.clock)
        self._departed: set[str] = set()
        cache.on_departure = self._departure

    # -- helpers ------------------------------------------------------------------------------------
    def _pod(self, pod: dict[str, Any]) -> PodInfo:
        """The pod kube-scheduler sent, read — or the watch's reading of it when that is the same
        version (UID, resourceVersion, namespace and name agree): a version's content never changes,
        and parsing the pod again cost ~0.1 ms per filter."""
        meta = pod.get("metadata")
        if type(meta) is dict:
            uid, rv = meta.get("uid"), meta.get("resourceVersion")
            if type(uid) is str and type(rv) is str and rv:
                known = self.cache.pending.get(uid)
                if (
                    known is not None
                    and known.resource_version == rv
                    and known.name == meta.get("name")
                    and known.namespace == (meta.get("namespace") or "default")
                ):
                    return known
        try:
            info = pod_info(pod, self.cache.gpu, "Pod")
            # Its UID and name are kept (decision memory, ring, holds): bounded like bind's.
            check_uid(info.uid, "Pod.metadata.uid")
            check_pod_ref(info.namespace, info.name, "Pod.metadata.namespace", "Pod.metadata.name")
            return info
        except InvalidName as exc:
            raise BadRequest(exc.field, exc.message) from None
        except ObjectError as exc:
            message = str(exc).split(": ", 1)[1] if ": " in str(exc) else str(exc)
            if exc.field.startswith("Pod.spec"):
                raise UnreadablePod(exc.field, message) from None
            raise BadRequest(exc.field, message) from None
        except Exception as exc:  # noqa: BLE001 - whatever the pod holds, a client error, never a 500
            raise UnreadablePod("Pod", f"cannot be read ({describe(exc)})") from None

    def _indices(self, state: ClusterState, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Node indices for ``names`` (-1: unknown) and the sorted unique known ones. The last
        answer is reused when the same list comes again (prioritize after filter)."""
        key = (self.cache.epoch, len(names))
        if key == self._names_key and names == self._names_list:
            return self._names_idx, self._names_cand  # type: ignore[return-value]
        try:  # every name known (the usual case): __getitem__ is ~40 % cheaper than .get with a default
            idx = np.fromiter(map(state.index.__getitem__, names), dtype=np.int64, count=len(names))
        except KeyError:
            idx = np.fromiter(map(state.index.get, names, itertools.repeat(-1)), dtype=np.int64, count=len(names))
        # kube-scheduler's filters run in parallel, so the order of the names differs from pod to pod:
        # a mask over the nodes gives the sorted unique indices in O(nodes), without np.unique's sort.
        mask = np.zeros(state.num_nodes, dtype=np.bool_)
        mask[idx[idx >= 0]] = True
        cand = np.flatnonzero(mask)
        self._names_key, self._names_list, self._names_idx, self._names_cand = key, names, idx, cand
        return idx, cand

    def _names(self, state: ClusterState) -> np.ndarray:
        """The state's node names as a numpy array (fancy indexing instead of a Python loop)."""
        if self._names_arr_state is not state:  # by the state object: an epoch is bumped only at the rebuild
            self._names_arr = np.array(state.names, dtype=object)
            self._names_arr_state = state
        return self._names_arr

    def _holdable(self, info: PodInfo) -> tuple[PodInfo, bool] | None:
        """(the pod to hold cards for, whether provisionally) when filter may hold for ``info``: the
        watch's reading of a pending pod of ours under this name; or, when the watch has not seen
        the pod yet (kube-scheduler's informer often sees a new pod first: without a hold the next
        pod's filter took the same room, and this pod's bind failed — 12 of 2,000 pods at 100 pods/s),
        the request's own reading, held provisionally (ClusterCache.reserve). Never a pod bound or
        held under another name, nor another scheduler's."""
        ours = self.settings.kubernetes.scheduler_name
        known = self.cache.pending.get(info.uid)
        if known is None:
            if info.uid in self.cache.pods or info.node_name or info.spec is None or info.scheduler_name != ours:
                return None
            return info, True
        if known.key != info.key or known.node_name or known.spec is None or known.scheduler_name != ours:
            return None
        return known, False

    def _rules_problem(self, info: PodInfo) -> str | None:
        """Why the placement rules of the watch's pending pod ``info`` (same UID and name) cannot be
        read, or None (readable, or not seen by the watch yet)."""
        problem = self.cache.rules_problems.get(info.uid)
        if problem is None:
            return None
        known = self.cache.pending.get(info.uid)
        return problem if known is not None and known.key == info.key else None

    def _unknown(
        self, names: list[str], failed: dict[str, str], unresolvable: dict[str, str], why: str = UNKNOWN_NODE
    ) -> None:
        """Reasons for node names the state does not hold: a node the watch delivered but could not
        read is unresolvable with its reason; the others fail with ``why`` (the watch lags)."""
        rejected = self.cache.rejected_nodes
        for name in names:
            reason = rejected.get(name)
            if reason is None:
                failed[name] = why
            else:
                unresolvable[name] = (REJECTED_NODE + reason)[:MAX_REASON_CHARS]

    def _may_retry_on(self, info: PodInfo, held: Entry) -> bool:
        """Whether ``info`` may still go where its earlier bind (``held``) went: the same request, and a card
        model it allows (a node relabelled meanwhile, by a MIG reconfiguration say, is decided afresh)."""
        state = self.cache.state
        if info.spec is None or held.spec != info.spec or state is None:
            return False
        idx = state.index.get(held.node)
        return idx is not None and bool(state.request(info.spec).model_ok[state.model_id[idx]])

    def _awaiting_bind(self, args: ExtenderArgs, info: PodInfo, node: str) -> dict[str, Any]:
        """Filter's answer for a pod whose earlier bind to ``node`` is in flight or has an unknown
        outcome (the write timed out: it may have succeeded): that node alone, so kube-scheduler's
        retry binds there and learns the outcome (bind re-sends the binding; "already assigned" to
        this node is success). A new decision would choose another node, and bind must refuse every
        other node while the earlier binding may stand: under an overloaded API server each such
        retry cost a decision, a refused bind and kube-scheduler's failure write, for every pod
        again and again until the outcome was known (docs/extender.md, "Bind"). When kube-scheduler
        did not offer ``node`` (it offers a share of the nodes), filter decides as usual.

        The pod's status changed with the failed bind (kube-scheduler wrote it): filter's memory of
        the earlier decision is kept under the version the retry carries, so the bind's record still
        says whether it followed the policy."""
        remembered = self.memory.get(info.uid)
        if remembered is not None and remembered.info.key == info.key:
            self.memory.put(info.uid, replace(remembered, info=info))
        self._count("awaiting_bind")
        return self._filter_result(args, [node], {}, {})

    def _count(self, outcome: str) -> None:
        self.counts[outcome] = self.counts.get(outcome, 0) + 1
        if self.metrics is not None:
            self.metrics.decisions.labels(outcome).inc()

    def _check_count(self, count: int, field: str) -> None:
        """BadRequest when a request names far more nodes than the cluster has (NODE_NAMES_SLACK)."""
        state = self.cache.state
        known = state.num_nodes if state is not None else 0
        limit = 2 * known + NODE_NAMES_SLACK
        if count > limit:
            raise BadRequest(
                field,
                f"{count} node names, more than the {known} nodes the extender knows can explain (at most "
                f"{limit}); send the nodes kube-scheduler found feasible, each once",
            )

    # -- filter -------------------------------------------------------------------------------------
    async def filter(self, args: ExtenderArgs) -> dict[str, Any]:
        self._check_count(len(args.node_names), "NodeNames")
        try:
            info = self._pod(args.pod)
        except UnreadablePod as exc:
            # A stored pod kube-apiserver accepted but we cannot read (a quantity beyond any node, a
            # field of an odd type): unschedulable with the reason, in its FailedScheduling event.
            self._count("invalid")
            why = f"pod cannot be scheduled by {self.settings.kubernetes.scheduler_name}: {exc}"[:MAX_REASON_CHARS]
            return self._filter_result(args, [], {}, {n: why for n in args.node_names})
        names = args.node_names
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        self.refused.drop(info.uid)  # decided afresh now
        held = self.cache.pods.get(info.uid)
        if held is not None and held.key == info.key:
            if held.status in (ASSUMED, UNCERTAIN) and held.node in names and self._may_retry_on(info, held):
                return self._awaiting_bind(args, info, held.node)
            self.cache.unreserve(info.uid)  # a new decision for this pod: its last one no longer holds
        problem = self._rules_problem(info)
        if problem is not None:
            # bind would refuse it on every node: no node kept, no cards held (they would block others)
            self._count("invalid")
            why = (
                f"pod cannot be scheduled by {self.settings.kubernetes.scheduler_name}: its placement rules "
                f"cannot be read: {problem}"
            )[:MAX_REASON_CHARS]
            return self._filter_result(args, [], {}, {n: why for n in names})
        for _attempt in range(3):
            state = self.cache.state
            epoch = self.cache.epoch
            if state is None:
                why = "the extender has not seen any node yet (starting, or no nodes in the cluster)"
                self._unknown(names, failed, unresolvable, why)
                return self._filter_result(args, [], failed, unresolvable)
            idx, cand = self._indices(state, names)
            known = idx >= 0
            if info.spec is None:
                why = f"pod's GPU request cannot be served: {info.problem}"
                self._count("invalid")
                return self._filter_result(args, [], failed, {n: why for n in names})
            req = state.request(info.spec)
            seen, held_for = self._with_nominated(state, info, cand)
            outcome = await self.engine.decide(seen, self.cache.tiebreak, req, cand)
            # Reading the state rebuilds it if the nodes changed during the decision (a model run in a
            # thread yields); pods placed meanwhile may have taken the chosen node's room.
            if (
                self.cache.state is state
                and self.cache.epoch == epoch
                and (
                    outcome.decision is None or fits_on_cards(state, req, outcome.decision.node, outcome.decision.cards)
                )
            ):
                break
        else:  # pragma: no cover - the node set changed three times during one decision
            raise BadRequest("", "the node set kept changing during the decision; retry", 503)
        self._unknown([names[i] for i in np.flatnonzero(~known).tolist()], failed, unresolvable)
        verdict = outcome.verdict
        if verdict is not None and verdict.action == "delay" and outcome.decision is None:
            # Nothing fits: a hold would wait for nothing the pod does not wait for anyway, hide the
            # real reasons (and keep the pod from preempting), and, never counted, move its end at
            # every retry. The bundled model delays only pods that fit; a scorer of yours may not.
            outcome = replace(outcome, verdict=None)
        elif verdict is not None and verdict.action == "delay":
            left = self.holds.admit(info.uid, self.cache.clock(), verdict.retry_after_s)
            if left is None:
                outcome = replace(outcome, verdict=None)  # held often enough: placed now
            elif left != verdict.retry_after_s:  # the hold that runs: its end and the time left, not a new one
                outcome = replace(outcome, verdict=replace(verdict, retry_after_s=round(left, 3)))
        remembered = Remembered(info, epoch, outcome, self.cache.clock())
        self.memory.put(info.uid, remembered)
        if outcome.verdict is not None:
            return self._verdict(args, info, outcome, outcome.verdict, failed, unresolvable)
        decision = outcome.decision
        kept: list[str] = []
        if decision is not None:
            kept_idx = self._top(state, outcome)
            kept = self._names(state)[kept_idx].tolist()
            remembered.kept, remembered.kept_idx = kept, kept_idx
        else:
            # Reasons only for an unschedulable pod: kube-scheduler reads FailedNodes only when no node
            # is left (the FailedScheduling event, preemption's candidates); with a node kept they were
            # ~165 entries, ~22 KB that it decoded and threw away for every pod (docs/benchmarks.md).
            self._reasons(state, epoch, req, cand, failed, unresolvable, seen, held_for)
            if info.scheduler_name == self.settings.kubernetes.scheduler_name and not info.node_name:
                self.refused.add(info, epoch, cand)
        self._count("unschedulable" if decision is None else outcome.served_by)
        explained = (
            self.engine.without_load(seen, self.cache.tiebreak, req, cand, outcome)
            if self.settings.explain_load
            else None
        )
        build = self._record_filter(info, seen, req, outcome, len(cand), kept, explained)  # copies what it saw
        shadow = decision is not None and self.engine.settings.mode == "shadow" and self.engine.model is not None
        if shadow and seen is state:
            seen = state.copy()  # the shadow policy looks at the state without the hold (a trial has none)
        # kube-scheduler binds a single kept node: hold it until the bind comes, now (the next pod's
        # filter must see it), for a pending pod of ours — provisionally when the watch has not seen
        # it yet (_holdable)
        ours = self._holdable(info) if decision is not None and len(kept) == 1 else None
        if ours is not None and decision is not None:
            self.cache.reserve(ours[0], kept[0], decision.cards, provisional=ours[1])
        if shadow:
            self._shadow(build(), seen, req, cand, outcome)
        else:
            self.ring.append_lazy(build)
        return self._filter_result(args, kept, failed, unresolvable)

    def _departure(self, node: str) -> None:
        """The cache let go a pod that held room on ``node`` (called inside its step): noted, and the
        pods filter refused moments before are checked once the step is done (:meth:`_check_room`),
        on the state as it is then — a pod moved, or a hold retaken, in the same step frees nothing."""
        if not len(self.refused):
            return
        if not self._departed:
            try:
                asyncio.get_running_loop().call_soon(self._check_room)
            except RuntimeError:  # no event loop (a script driving the cache): nothing to wait for
                self._departed.add(node)
                self._check_room()
                return
        self._departed.add(node)

    def _check_room(self) -> None:
        """The pods filter refused within :data:`~rlsched.extender.refused.RACE_WINDOW_S` that fit a
        node a pod just left get a ``room`` record, which the operator answers with a requeue:
        kube-scheduler saw that departure first, and will not retry them for it."""
        if self.cache.relisting and self._departed:  # a relist half applied: the check waits for its end
            with contextlib.suppress(RuntimeError):  # no event loop: checked at the next departure
                asyncio.get_running_loop().call_later(RELIST_RECHECK_S, self._check_room)
            return
        names, self._departed = self._departed, set()
        state = self.cache.state
        if state is None or not len(self.refused):
            return
        nodes = [i for i in map(state.index.get, names) if i is not None]
        facts = self.cache.node_facts
        for info, node in self.refused.fitting(
            state, self.cache.epoch, nodes, self.cache.pod_rules, lambda i: facts.get(state.names[i])
        ):
            name = state.names[node]
            self.ring.append(
                {
                    "kind": "room",
                    "pod": _pod_ref(info),
                    "node": name,
                    "reason": f"room freed on {name} moments after filter refused the pod",
                }
            )

    def _with_nominated(self, state: ClusterState, info: PodInfo, cand: np.ndarray) -> tuple[ClusterState, list[int]]:
        """The state filter decides on for ``info`` among ``cand``, and the candidate nodes where it
        differs from ``state``: a trial copy with the pods nominated to a candidate node ahead of
        ``info`` counted there (:meth:`ClusterCache.nominated_ahead_of`), as kube-scheduler's own
        filters count them for cpu, memory and whole cards. Without it share pods of lower priority
        took the card that preemption had freed for the nominated pod (kube-scheduler ignores
        ``rlsched.io/gpu-milli``), and the preemptor was stuck: kube-scheduler found it room on the
        node by whole cards, and no victim to evict (docs/extender.md).
        ``state`` itself and no nodes in the usual case, when nothing is nominated to a candidate."""
        ahead = self.cache.nominated_ahead_of(info)
        if not ahead:
            return state, []
        offered: dict[str, list[PodInfo]] = {}
        for node, pods in ahead.items():
            i = state.index.get(node)
            if i is not None:
                pos = int(np.searchsorted(cand, i))
                if pos < len(cand) and cand[pos] == i:
                    offered[node] = pods
        if not offered:
            return state, []
        trial = state.copy()
        return trial, place_nominated(trial, offered)

    def _reasons(
        self,
        state: ClusterState,
        epoch: int,
        req: PodRequest,
        cand: np.ndarray,
        failed: dict[str, str],
        unresolvable: dict[str, str],
        seen: ClusterState | None = None,
        held_for: Sequence[int] = (),
    ) -> None:
        """Why each candidate that does not fit fails: resolvable (preemption may help) or not.

        ``seen``: the trial filter decided on (:meth:`_with_nominated`), which differs from
        ``state`` on the nodes ``held_for`` only: their reasons are not memoized (the memo follows
        ``state``), and a node that fits but for the nominated pods says so."""
        seen = state if seen is None else seen
        ok = feasible_mask(seen, req)
        bad = cand[~ok[cand]]
        if len(bad):
            texts = self.reason_memo.reasons(state, epoch, req, bad)
            if held_for:
                fits_alone = feasible_mask(state, req)
                for pos in np.flatnonzero(np.isin(bad, np.asarray(held_for, dtype=np.int64))).tolist():
                    n = int(bad[pos])
                    why = infeasibility_reason(seen, req, n, detail=False)
                    texts[pos] = f"{why}; {HELD_FOR_NOMINATED}" if fits_alone[n] else why
            unres = unresolvable_mask(state, req)[bad]
            bad_names = self._names(state)[bad]
            unresolvable.update(zip(bad_names[unres].tolist(), texts[unres].tolist(), strict=True))
            failed.update(zip(bad_names[~unres].tolist(), texts[~unres].tolist(), strict=True))

    def _top(self, state: ClusterState, outcome: Outcome) -> np.ndarray:
        """Node indices filter keeps: the chosen node first, then the next best up to ``topK``."""
        decision = outcome.decision
        assert decision is not None
        k = self.engine.settings.top_k
        if decision.scores is None or k == 1:
            return np.array([decision.node]) if k else decision.feasible
        feasible = decision.feasible
        if k == 0 or k >= len(feasible):  # everything; the chosen node first
            return np.concatenate(([decision.node], feasible[feasible != decision.node]))
        values = np.asarray(decision.scores.values, dtype=np.float64)
        top = np.argpartition(-values, k)[: k + 1]  # the k + 1 best, then ordered by value and node order
        top = top[np.lexsort((self.cache.tiebreak.rank[feasible[top]], -values[top]))]
        ranked = feasible[top]
        return np.concatenate(([decision.node], ranked[ranked != decision.node][: k - 1]))

    def _filter_result(
        self, args: ExtenderArgs, kept: list[str], failed: dict[str, str], unresolvable: dict[str, str]
    ) -> dict[str, Any]:
        """The ExtenderFilterResult. ``failed`` and ``unresolvable`` are disjoint by construction."""
        if args.cache_capable:
            return {
                "Nodes": None,
                "NodeNames": kept,
                "FailedNodes": failed,
                "FailedAndUnresolvableNodes": unresolvable,
                "Error": "",
            }
        position = {n: i for i, n in enumerate(args.node_names)}
        items = [args.node_items[position[n]] for n in kept]  # type: ignore[index]
        return {
            "Nodes": {"metadata": {}, "items": items},
            "NodeNames": None,
            "FailedNodes": failed,
            "FailedAndUnresolvableNodes": unresolvable,
            "Error": "",
        }

    def _verdict(
        self,
        args: ExtenderArgs,
        info: PodInfo,
        outcome: Outcome,
        verdict: Verdict,
        failed: dict[str, str],
        unresolvable: dict[str, str],
    ) -> dict[str, Any]:
        scheduler = self.settings.kubernetes.scheduler_name
        if verdict.action == "delay":
            until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock() + verdict.retry_after_s))
            why = f"delayed by policy {scheduler} until {until} (retry in {verdict.retry_after_s:.0f}s)" + (
                f": {verdict.reason}" if verdict.reason else ""
            )
            failed = {n: why for n in args.node_names}
            self._count("delayed")
        else:
            why = f"rejected by policy {scheduler}" + (f": {verdict.reason}" if verdict.reason else "")
            unresolvable = {n: why for n in args.node_names}
            failed = {}
            self._count("rejected")
        self.ring.append(
            {
                "kind": "filter",
                "pod": _pod_ref(info),
                "node": None,
                "cards": [],
                "verdict": verdict.action,
                "reason": verdict.reason,
                "retryAfterSeconds": verdict.retry_after_s,
                "servedBy": outcome.served_by,
                "scorer": outcome.scorer,
                "modelVersion": outcome.model_version,
                "mode": self.engine.settings.mode,
            }
        )
        return self._filter_result(args, [], failed, unresolvable)

    def _record_filter(
        self,
        info: PodInfo,
        state: ClusterState,
        req: PodRequest,
        outcome: Outcome,
        candidates: int,
        kept: list[str],
        without_load: dict[str, Any] | None = None,
    ) -> Callable[[], dict[str, Any]]:
        """The filter's decision record, as a function that builds it (the ring builds it when read).

        What changes after the answer — the chosen node's free resources, the cluster's allocation —
        is copied now; the rest (the outcome, the node names of this state) does not change. The
        function keeps only what the record reports: the decision's arrays over the feasible nodes
        (~24 bytes a node) are reduced to the five best now, or the ring's 4,096 records held ~0.1 GB
        of them at 1,000 nodes and ~0.5 GB at 5,000."""
        decision = outcome.decision
        names = state.names
        mode = self.engine.settings.mode
        node = decision.node if decision is not None else None
        cards = list(decision.cards) if decision is not None else []
        feasible = int(len(decision.feasible)) if decision is not None else 0
        seen = _features_seen(state, node)
        top = _top_positions(outcome)
        outcome = replace(outcome, decision=None)

        def build() -> dict[str, Any]:
            record = {
                "kind": "filter",
                "pod": _pod_ref(info),
                "node": names[node] if node is not None else None,
                "cards": cards,
                "kept": kept,
                "servedBy": outcome.served_by,
                "scorer": outcome.scorer,
                "fallbackReason": outcome.fallback_reason,
                "error": outcome.error or None,
                "modelVersion": outcome.model_version,
                "mode": mode,
                "candidates": candidates,
                "feasible": feasible,
                "topScores": [{"node": names[n], "score": v} for n, v in top],
                "policyMs": None if outcome.policy_ms is None else round(outcome.policy_ms, 3),
                "features": _features(req, seen),
            }
            if without_load is not None:
                record["withoutLoad"] = without_load
            return record

        return build

    def _shadow(
        self,
        record: dict[str, Any],
        state: ClusterState,
        req: PodRequest,
        cand: np.ndarray,
        outcome: Outcome,
    ) -> None:
        """Shadow mode: evaluate the policy after the answer, on ``state`` (a copy taken before
        filter's hold); the record goes to the ring then."""

        async def run() -> None:
            try:
                record["shadow"] = await self.engine.shadow(state, self.cache.tiebreak, req, cand, outcome)
            except Exception as exc:  # noqa: BLE001 - shadow is best effort
                record["shadow"] = {"error": f"{type(exc).__name__}: {exc}"}
            self.ring.append(record)

        task = asyncio.get_running_loop().create_task(run())
        self._shadow_tasks.add(task)
        task.add_done_callback(self._shadow_tasks.discard)

    # -- prioritize ---------------------------------------------------------------------------------
    async def prioritize(self, args: ExtenderArgs) -> list[dict[str, Any]]:
        self._check_count(len(args.node_names), "NodeNames")
        info = self._pod(args.pod)
        names = args.node_names
        state = self.cache.state
        if state is None or info.spec is None or not names:
            return [{"Host": n, "Score": 0} for n in names]
        remembered = self.memory.get(info.uid, info.resource_version)
        if (
            remembered is not None
            and remembered.epoch == self.cache.epoch
            and names == remembered.kept
            and remembered.kept_idx is not None  # set with kept
        ):
            idx = remembered.kept_idx  # kube-scheduler sends back what filter kept: no lookups
        else:
            idx, cand = self._indices(state, names)
        if remembered is None or remembered.epoch != self.cache.epoch:
            req = state.request(info.spec)
            epoch = self.cache.epoch
            seen, _ = self._with_nominated(state, info, cand)
            outcome = await self.engine.decide(seen, self.cache.tiebreak, req, cand)
            if self.cache.state is not state or self.cache.epoch != epoch:  # reading it rebuilds it
                return [{"Host": n, "Score": 0} for n in names]
            # Verdicts are filter's to serve: this pod passed filter, and a delay decided here must
            # not make bind refuse it.
            outcome = replace(outcome, verdict=None)
            remembered = Remembered(info, epoch, outcome, self.cache.clock())
            self.memory.put(info.uid, remembered)
        scores = extender_scores(remembered.outcome, idx, self.cache.tiebreak.rank)
        return [{"Host": n, "Score": s} for n, s in zip(names, scores.tolist(), strict=True)]

    # -- bind ---------------------------------------------------------------------------------------
    async def bind(self, args: BindingArgs) -> dict[str, Any]:
        try:  # before anything else: these names go into API paths
            check_uid(args.pod_uid)
            check_pod_ref(args.pod_namespace, args.pod_name)
            check_node_name(args.node)
        except InvalidName as exc:
            raise BadRequest(exc.field, exc.message) from None
        if self.binder is None:
            return {"Error": "this extender was started without a binder (no API server access)"}
        # By UID and name, whatever the version (as preempt): the watch's reading may be a version
        # behind the request filter remembered, and a lookup by its version missed a delay.
        remembered = self.memory.get(args.pod_uid)
        if remembered is not None and remembered.info.key != f"{args.pod_namespace}/{args.pod_name}":
            remembered = None
        verdict = remembered.outcome.verdict if remembered is not None else None
        result: BindResult
        if verdict is not None:
            # As preempt does: a pod the policy delayed or rejected is not bound by a caller that
            # skipped filter or ignored its answer.
            result = BindResult(
                f"refused: the policy held pod {args.pod_namespace}/{args.pod_name} back ({verdict.action})",
                args.node,
                result="refused",
            )
        else:
            result = await self.binder.bind(args.pod_uid, args.pod_namespace, args.pod_name, args.node)
        if self.metrics is not None:
            self.metrics.binds.labels(result.result).inc()
            if result.write_s is not None:
                self.metrics.binding_write.labels(result.result).observe(result.write_s)
        chosen = None
        if remembered is not None and remembered.outcome.decision is not None:
            state = self.cache.state  # may rebuild (a new epoch): read it before comparing epochs
            if state is not None and remembered.epoch == self.cache.epoch:
                chosen = state.names[remembered.outcome.decision.node]
        self.ring.append(
            {
                "kind": "bind",
                "pod": {"uid": args.pod_uid, "namespace": args.pod_namespace, "name": args.pod_name},
                "node": args.node,
                "cards": list(result.cards),
                "gpuMilliPerCard": result.milli,
                "result": result.result,
                "error": result.error or None,
                "policyNode": chosen,
                "followedPolicy": None if chosen is None else chosen == args.node,
            }
        )
        if not result.error:
            self.memory.pop(args.pod_uid)
            self.holds.forget(args.pod_uid)
        return {"Error": result.error}

    # -- preempt ------------------------------------------------------------------------------------
    async def preempt(self, args: PreemptionArgs) -> dict[str, Any]:
        """Keep the candidate nodes where evicting the given victims frees what the pod needs
        (GPU cards included).

        Like bind, preempt trusts no caller: the preemptor must be one of our pending pods, read from
        the watch cache or the API server (not the request's copy). A node is kept only when the cache
        holds every victim sent for it on that node: kube-scheduler takes the victims we answer as
        the ones to evict without checking them again, so a node whose victims we cannot all see
        (the watch behind, or an unreadable pod) is dropped rather than answered with a partial list
        that evicts pods and still leaves the preemptor without room. The preemptor's own hold from
        an earlier filter is released in the trial; what would take the victims' room before the
        preemptor is counted in it (:meth:`_fill_trial`). Victims go back by UID, as sent (each once)."""
        self._check_count(len(args.victims), "NodeNameToMetaVictims")
        sent = self._pod(args.pod)
        try:
            check_pod_ref(sent.namespace, sent.name, "Pod.metadata.namespace", "Pod.metadata.name")
        except InvalidName as exc:
            raise BadRequest(exc.field, exc.message) from None
        info = await self._preemptor(sent)
        state = self.cache.state
        held_back = False
        if info is not None:
            # By UID, whatever the version: filter remembered the request's resourceVersion, and the
            # watch's reading read here may be a version behind kube-scheduler's informer (or ahead).
            remembered = self.memory.get(info.uid)
            held_back = (
                remembered is not None and remembered.info.key == info.key and remembered.outcome.verdict is not None
            )
        if state is None or info is None or info.spec is None or held_back:
            self._count_preempt(dropped=len(args.victims))
            return {"NodeNameToMetaVictims": {}}
        trial = state.copy()
        own = self.cache.pods.get(info.uid)
        if own is not None and own.status == RESERVED and own.placement is not None:
            trial.release(own.placement)  # its hold would otherwise count against itself
        known: dict[str, list[str]] = {}
        for node, (uids, _) in args.victims.items():
            mine = known.setdefault(node, [])
            for uid in dict.fromkeys(uids):  # a victim named twice is released once
                entry = self.cache.pods.get(uid)
                if entry is None or entry.placement is None or entry.node != node or entry.status == RESERVED:
                    known[node] = []  # one victim we cannot see on the node: not this node
                    break
                try:
                    trial.release(entry.placement)
                except ValueError:  # pragma: no cover - bookkeeping bug; be conservative
                    log.error("preempt: cannot release %s on %s in the trial state", entry.key, node)
                    known[node] = []
                    break
                mine.append(uid)
        self._fill_trial(trial, info, [node for node, uids in known.items() if uids])
        req = trial.request(info.spec)
        ok = feasible_mask(trial, req)
        out: dict[str, Any] = {}
        kept = dropped = 0
        for node, (_, pdb) in args.victims.items():
            i = state.index.get(node)
            if not known[node] or i is None or not ok[i]:
                dropped += 1
                continue
            kept += 1
            out[node] = {"Pods": [{"UID": u} for u in known[node]], "NumPDBViolations": pdb}
        self._count_preempt(kept, dropped)
        return {"NodeNameToMetaVictims": out}

    def _fill_trial(self, trial: ClusterState, preemptor: PodInfo, nodes: list[str]) -> None:
        """Count in ``trial`` (the victims released) what takes their room on ``nodes`` before the
        preemptor can, so that a node is kept only where it still fits after that:

        - the node's pods the cache could not count (``ClusterCache.uncounted``: a running pod that
          another scheduler started where no whole card was free, say): when a victim leaves, the
          cache counts them first (``_retry_unplaced``), on their own cards or by the default rule. They
          are placed here the same way rather than the node dropped outright: a node with room for
          them and the preemptor stays a candidate. All of them, after all the victims (the cache
          counts the first 64 per release and the rest at its next sweep, and kube-scheduler
          deletes the victims in no set order);
        - pods nominated to the node with at least the preemptor's priority, which kube-scheduler's
          own fit check adds to the node (RunFilterPluginsWithNominatedPods) and schedules first:
          placed by the default card rule, as the watch read them (of any scheduler: kube-scheduler
          knows only its own, so this may drop a node it would keep, never the reverse). One that
          does not fit yet holds the room it could use of what is free (``place_nominated``).
        """
        for node in nodes:
            for entry in self.cache.uncounted(node):
                fit_again(trial, entry)
        place_nominated(trial, self.cache.nominated_ahead_of(preemptor, nodes))

    async def _preemptor(self, sent: PodInfo) -> PodInfo | None:
        """The preemptor as it is now (cache, else a GET), if it is ours and pending; else None."""
        info: PodInfo | None
        if self.binder is not None:
            current = await self.binder.current_pod(sent.uid, sent.namespace, sent.name)
            if isinstance(current, BindResult):
                log.info("preempt for %s ignored: %s", sent.key, current.error, extra={"event": "preempt_refused"})
                return None
            info = current[0]
        else:
            info = self.cache.pending.get(sent.uid)
            if info is None or info.key != sent.key:
                return None
        if info.scheduler_name != self.settings.kubernetes.scheduler_name or info.node_name:
            return None
        return info

    def _count_preempt(self, kept: int = 0, dropped: int = 0) -> None:
        if self.metrics is not None:
            self.metrics.preempt_nodes.labels("kept").inc(kept)
            self.metrics.preempt_nodes.labels("dropped").inc(dropped)


def extender_scores(outcome: Outcome, idx: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Integer scores 0..10 for the nodes ``idx`` (-1: unknown) such that the decision survives.

    The decision's node gets 10 and every other node at most 9 (min-max scaled by the scorer's
    values), so with score plugins off kube-scheduler's sum has a unique maximum at the policy's
    node. Nodes that are infeasible or unknown get 0. When kube-scheduler offers nodes without the
    decision's node, the best of those (ties by the node order) gets 10.
    """
    out = np.zeros(len(idx), dtype=np.int64)
    decision = outcome.decision
    if decision is None or outcome.verdict is not None:
        return out
    feasible = decision.feasible
    if decision.scores is None:
        values_all = np.zeros(len(feasible))
    else:
        values_all = np.asarray(decision.scores.values, dtype=np.float64)
    pos = np.searchsorted(feasible, idx)
    pos = np.minimum(pos, len(feasible) - 1)
    has = (idx >= 0) & (feasible[pos] == idx)
    if not has.any():
        return out
    values = np.where(has, values_all[pos], np.nan)
    chosen = np.flatnonzero(has & (idx == decision.node))
    if len(chosen):
        top = int(chosen[0])
    else:
        best = np.flatnonzero(has & (values == np.nanmax(values)))
        top = int(best[np.argmin(rank[idx[best]])])
    v = values[has]
    lo, hi = float(v.min()), float(v.max())
    if hi > lo:
        scaled = np.floor((values - lo) * (MAX_EXTENDER_PRIORITY - 1) / (hi - lo))
    else:
        scaled = np.full(len(values), MAX_EXTENDER_PRIORITY - 1, dtype=np.float64)
    out[has] = np.clip(scaled[has], 0, MAX_EXTENDER_PRIORITY - 1).astype(np.int64)
    out[idx == idx[top]] = 0  # duplicates of the top node in a malformed list get nothing extra
    out[top] = MAX_EXTENDER_PRIORITY
    return out


def _pod_ref(info: PodInfo) -> dict[str, str]:
    return {"uid": info.uid, "namespace": info.namespace, "name": info.name}


def _top_positions(outcome: Outcome, k: int = 5) -> list[tuple[int, float | None]]:
    """The ``k`` best nodes of the decision (node index, score rounded to 4 places), best first; the
    chosen node with no score when only it fitted; nothing without a decision."""
    decision = outcome.decision
    if decision is None:
        return []
    if decision.scores is None:
        return [(decision.node, None)]
    values = np.asarray(decision.scores.values, dtype=np.float64)
    k = min(k, len(values))
    top = np.argpartition(-values, k - 1)[:k]
    top = top[np.argsort(-values[top], kind="stable")]
    return [(int(decision.feasible[p]), round(float(values[p]), 4)) for p in top]


@dataclass(frozen=True)
class _Seen:
    """What a decision saw of the state that changes afterwards (copied at decision time)."""

    node: tuple[int, int, int, int, int, str, np.ndarray] | None
    """The chosen node: cpu free, memory free, cards, full free cards, GPU milli free, model, load row."""
    gpu_allocated: int
    gpu_capacity: int


def _features_seen(state: ClusterState, node: int | None) -> _Seen:
    row = None
    if node is not None:
        model = state.model_names[state.model_id[node]] if state.model_id[node] >= 0 else ""
        row = (
            int(state.cpu_free[node]),
            int(state.mem_free[node]),
            int(state.gpu_count[node]),
            int(state.full_free[node]),
            int(state.card_free[node].sum()),
            model,
            state.load[node].copy(),
        )
    return _Seen(row, state.gpu_milli_allocated, state.gpu_milli_capacity)


def _features(req: PodRequest, seen: _Seen) -> dict[str, Any]:
    """A compact summary of what the decision saw (the decision log keeps it for retraining)."""
    out: dict[str, Any] = {
        "pod": {
            "cpuMilli": req.cpu_milli,
            "memoryMiB": req.memory_mib,
            "numGpu": req.num_gpu,
            "gpuMilli": req.gpu_milli,
            "constrained": req.constrained,
            "latencySensitive": req.latency_sensitive,
        }
    }
    if seen.node is not None:
        cpu, mem, cards, full, milli, model, load = seen.node
        out["node"] = {
            "cpuFreeMilli": cpu,
            "memFreeMiB": mem,
            "gpuCount": cards,
            "fullFreeCards": full,
            "gpuFreeMilli": milli,
            "gpuModel": model,
            "load": {m: (None if np.isnan(v) else round(float(v), 4)) for m, v in zip(LOAD_METRICS, load, strict=True)},
        }
    out["cluster"] = {
        "gpuAllocatedFraction": round(seen.gpu_allocated / max(seen.gpu_capacity, 1), 4),
        "milliPerCard": MILLI_PER_CARD,
    }
    return out
