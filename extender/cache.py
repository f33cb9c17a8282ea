"""The extender's picture of the cluster: nodes and pods from the watch, plus pods bind has assumed.

All of it lives in one :class:`~rlsched.policy.cluster.ClusterState` (arrays over nodes) so that the
filter/prioritize path runs vectorized without any API call. Pods are placed and released by UID;
the state is rebuilt (lazily, at the next read) when the node set or a node's capacity changes.

Only the event loop's thread mutates the cache; every mutation is synchronous (no ``await`` inside),
so a filter never sees half an update and a bind's check-and-reserve cannot interleave with another.

An object that cannot be read — whatever the exception — is logged once per version, counted and
ignored (:mod:`rlsched.extender.rejections`): one odd pod anywhere in the cluster must not stop the
watch. Besides the ClusterState the cache keeps what bind's placement rules need
(:mod:`rlsched.extender.node_rules`): every node's labels and NoSchedule/NoExecute taints, and the
tolerations, nodeSelector and required node affinity of our scheduler's pending pods — small frozen
values, not the raw objects.

Most watch events change nothing the cache reads: kwok's (and kubelet's) status updates of a running
pod, node heartbeats. Each object's last applied version leaves a 16-byte digest of the parts that
are read (:func:`pod_digest`, :func:`node_digest`); an event with the same digest only refreshes the
pod's resourceVersion, skipping the object's parsing. A rejected version leaves its digest too: the
same unreadable content again under a new resourceVersion (a node's heartbeat, a pod's status
update) is neither parsed, logged nor counted — the rejection counters count unreadable versions
whose read parts differ, not events (an object with a read part that is not plain JSON data has no
digest: it is read every time, and logged and counted once per resourceVersion).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import orjson

from rlsched.policy.cards import default_cards
from rlsched.policy.cluster import (
    LOAD_METRICS,
    MUTABLE_ARRAYS,  # the per-node rows ClusterState.copy copies
    ClusterState,
    NodeSpec,
    Placement,
    PodSpec,
)
from rlsched.policy.scorers import TieBreak

from .node_rules import NodeFacts, PodRules, node_facts, pod_rules
from .objects import PodInfo, PodRequestError, node_addresses, node_spec, pod_info
from .pending import PendingPods
from .rejections import Rejections, identity, short_reason
from .settings import GpuConventions

log = logging.getLogger("rlsched.extender.cache")

BOUND, ASSUMED, UNCERTAIN, RESERVED = "bound", "assumed", "uncertain", "reserved"
"""Entry states: seen bound by the watch; reserved by our bind (binding in flight or done but not
yet seen by the watch); binding outcome unknown (a write timed out) — released after a TTL; held
by filter's decision until its bind arrives (kube-scheduler binds asynchronously: without it, the
next pods' filters would not see the cards and could choose them again) — released after a TTL,
by a new decision for the pod, or by a bind elsewhere."""
PROVISIONAL_HOLD_S = 5.0
"""How long filter holds cards for a pod the watch has not seen yet (the watch lags kube-scheduler's
informer by milliseconds; a pod it never shows was made up or is gone)."""
MAX_PROVISIONAL_HOLDS = 64
"""Provisional holds at once (kube-scheduler binds one pod at a time per profile)."""
MAX_PROVISIONAL_SEEN = 4096
"""UIDs remembered as provisionally held once."""
RELIST_SLICE = 256
"""Objects a relist applies between two pauses (the ``*_in_slices`` methods): at ~10 µs (nodes,
pods unchanged) to ~60 µs (pods changed) each, a few milliseconds of the event loop per slice,
where applying a list of 20,000 pods in one step held it for up to a second."""
RETRY_PER_RELEASE = 64
"""Uncounted pods of a node tried again when it frees something: the first found uncounted (then
running pods first, the oldest first); the rest wait for the next sweep (:meth:`ClusterCache.retry_unplaced`). Without
the bound, each release tried every one: 5,000 pods pinned to one node past what it can count
(``ClusterState.place``) took 27 s of the event loop to delete."""
MAX_REJECTED_NODES = 8192
"""Names of nodes the watch delivered but could not read, remembered with the reason (the oldest
forgotten beyond this)."""
MAX_REJECTED_PODS = 8192
"""UIDs of pods whose latest version could not be used, remembered with its digest so that the same
content again is skipped (the oldest forgotten beyond this: it is then read, logged and counted once
more)."""


@dataclass
class Entry:
    """A pod that holds resources on a node."""

    uid: str
    key: str
    """namespace/name."""
    node: str
    spec: PodSpec
    cards: tuple[int, ...]
    status: str
    since: float
    """Monotonic time of the last status change."""
    placement: Placement | None = None
    """Where it sits in the current ClusterState (None: could not be placed — see ``problem``)."""
    problem: str = ""
    bind_done: bool = False
    """Our bind created the binding (the watch has not shown it yet while status is ASSUMED)."""


def running(entry: Entry) -> bool:
    """Whether the pod may be running on its node: seen bound, bound by us, or a binding whose outcome
    is unknown. Such a pod is counted whatever it asked (``ClusterState.place``'s ``overcommit``):
    uncounted, its cards would read as free and go to another pod."""
    return entry.status in (BOUND, UNCERTAIN) or (entry.status == ASSUMED and entry.bind_done)


@dataclass
class CacheStats:
    """Counters for /status and /metrics."""

    node_errors: int = 0
    pod_errors: int = 0
    unplaceable: int = 0
    rebuilds: int = 0
    last_rebuild_s: float = 0.0
    events: dict[str, int] = field(default_factory=dict)


class ClusterCache:
    """Nodes, pods and the ClusterState built from them."""

    def __init__(
        self,
        gpu: GpuConventions,
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
        rejections: Rejections | None = None,
        scheduler_name: str | None = None,
    ):
        self.gpu = gpu
        self.seed = seed
        self.clock = clock
        self.rejections = rejections or Rejections()
        """Where unreadable objects are logged (once per version) and counted."""
        self.scheduler_name = scheduler_name
        """Placement rules are kept for pending pods of this scheduler only (None: every pending pod)."""
        self.nodes: dict[str, NodeSpec] = {}
        self.addresses: dict[str, list[str]] = {}
        self.node_facts: dict[str, NodeFacts | None] = {}
        """Labels and taints by node name (None: the node's taints could not be read — bind refuses it)."""
        self.pods: dict[str, Entry] = {}
        """Pods holding resources, by UID."""
        self.pending = PendingPods()
        """Pods without a node, by UID (bind looks pods up here before it falls back to a GET), and
        those of them nominated to a node (``pending.nominated``)."""
        self.pod_rules: dict[str, PodRules] = {}
        """Placement rules of pending pods (of ``scheduler_name``), by UID; a subset of ``pending``."""
        self.rules_problems: dict[str, str] = {}
        """Why the placement rules of a pending pod (of ``scheduler_name``) cannot be read, by UID; a
        subset of ``pending``, disjoint from ``pod_rules``. Filter answers such a pod unschedulable
        with the reason and holds nothing for it: bind would refuse it on any node."""
        self.rejected_nodes: OrderedDict[str, str] = OrderedDict()
        """Nodes whose latest version could not be read, by name → why (short), the newest last: filter
        and bind say so rather than "not seen yet". Forgotten when the node is deleted, missing from a
        relist, or a later version reads; at most MAX_REJECTED_NODES."""
        self._rejected_node_digests: dict[str, bytes] = {}
        """Node name → digest of its rejected latest version; keys a subset of ``rejected_nodes`` (in
        the same order), so bounded with it. That content again (heartbeats) is skipped: without it,
        each heartbeat of one unreadable node was parsed again and logged (a new resourceVersion)."""
        self._rejected_pods: OrderedDict[str, bytes] = OrderedDict()
        """UID → digest of the pod's latest version when it could not be used (unreadable, or bound
        with a request that cannot be counted at all), the newest last; at most MAX_REJECTED_PODS.
        Disjoint from ``_pod_digests``; dropped by any applied version, a delete or a relist without it."""
        self.provisional: OrderedDict[str, float] = OrderedDict()
        """UID → when filter first held cards for a pod the watch had not seen yet (:meth:`reserve`);
        kept after the hold ends, up to MAX_PROVISIONAL_SEEN, so a pod is held so only once."""
        self.provisional_live: dict[str, float] = {}
        """The provisional holds still waiting for the watch (UID → first hold)."""
        self.synced = {"nodes": False, "pods": False}
        self.stats = CacheStats()
        self.last_update = 0.0
        """Monotonic time of the last watch event or list."""
        self.epoch = 0
        """Bumped at every rebuild: node indices from an older epoch are meaningless."""
        self.generation = 0
        """Bumped at every change of the state (place, release, rebuild, load)."""
        self._state: ClusterState | None = None
        self._tiebreak: TieBreak | None = None
        self._dirty = True
        self._load: dict[str, np.ndarray] = {}
        self._pod_digests: dict[str, bytes] = {}
        """UID → digest of the pod version last applied (pending or holding resources)."""
        self._node_digests: dict[str, bytes] = {}
        """Node name → digest of the node version last applied."""
        self._unplaced: dict[str, dict[str, None]] = {}
        """Node name → UIDs of its entries that could not be placed (``placement`` None): tried again
        when the node frees something (:meth:`_retry_unplaced`), so a pod is not left uncounted for
        good. By node, so that a release costs the entries of its node only."""
        self._retry_paused = False
        self._retry_later: set[str] = set()
        """Nodes whose release left uncounted pods untried (more than :data:`RETRY_PER_RELEASE`)."""
        self.relisting = False
        """True while :meth:`replace_pods_in_slices` runs (between its slices too)."""
        self.on_departure: Callable[[str], None] | None = None
        """Called with the node name when a pod that held room there is let go (deleted, finished,
        gone from a relist), inside the cache's step: the extender only notes the node then
        (:mod:`rlsched.extender.refused`)."""
        self._maybe_reserved: dict[str, set[str]] = {}
        """Node name → UIDs filter held cards for there (:meth:`reserve`), some since bound or
        released: the holds are found here, not by a scan of every pod (:meth:`_reserved`)."""

    # -- reading ----------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """True once nodes and pods have been listed."""
        return self.synced["nodes"] and self.synced["pods"]

    @property
    def state(self) -> ClusterState | None:
        """The current state (rebuilt here if the node set changed); None without nodes."""
        if self._dirty:
            self._rebuild()
        return self._state

    @property
    def tiebreak(self) -> TieBreak:
        self.state  # noqa: B018 - rebuild if needed
        assert self._tiebreak is not None
        return self._tiebreak

    def age_s(self) -> float:
        """Seconds since the last watch event (inf before the first)."""
        return self.clock() - self.last_update if self.last_update else float("inf")

    # -- nodes ------------------------------------------------------------------------------------
    def set_node(self, node: Mapping[str, Any]) -> None:
        """A node was added or changed. An unreadable version is ignored (the last good one stays)."""
        digest = node_digest(node)
        if digest is not None and self._node_digests.get(digest[0]) == digest[1]:
            self._touch()  # a heartbeat: nothing read has changed
            self._forget_rejected(digest[0])  # back to its last good version after a bad one
            return
        if digest is not None and self._rejected_node_digests.get(digest[0]) == digest[1]:
            self._touch()  # a heartbeat of an unreadable version: logged and counted already
            return
        try:
            spec = node_spec(node, self.gpu)
        except Exception as exc:  # noqa: BLE001 - any failure on one object: log once, count, ignore
            self.stats.node_errors += 1
            self.rejections.reject("Node", node, exc)
            name = identity(node)[1]
            self._remember_rejected(name, exc, digest[1] if digest is not None and digest[0] == name else None)
            return
        self._forget_rejected(spec.name)
        try:
            facts: NodeFacts | None = node_facts(node)
        except Exception as exc:  # noqa: BLE001
            facts = None
            self.rejections.reject("Node", node, exc, "kept without placement rules (bind refuses it)")
        self.node_facts[spec.name] = facts
        self.addresses[spec.name] = node_addresses(node)
        if self.nodes.get(spec.name) != spec:
            self.nodes[spec.name] = spec
            self._dirty = True
        if digest is not None and digest[0] == spec.name:  # also without rules: logged once, kept so
            self._node_digests[spec.name] = digest[1]
        else:
            self._node_digests.pop(spec.name, None)
        self._touch()

    def _remember_rejected(self, name: str, exc: BaseException, digest: bytes | None = None) -> None:
        """Keep why node ``name`` could not be read, and the digest of that version (None: not plain
        enough to tell; it is then read again next time); nothing for a node without a name."""
        if not name:
            return
        self.rejected_nodes[name] = short_reason(exc)
        self.rejected_nodes.move_to_end(name)
        if digest is None:
            self._rejected_node_digests.pop(name, None)
        else:
            self._rejected_node_digests[name] = digest
        while len(self.rejected_nodes) > MAX_REJECTED_NODES:
            oldest, _ = self.rejected_nodes.popitem(last=False)
            self._rejected_node_digests.pop(oldest, None)

    def _forget_rejected(self, name: str) -> None:
        """Node ``name`` reads again, is deleted or is not listed: no longer rejected."""
        self.rejected_nodes.pop(name, None)
        self._rejected_node_digests.pop(name, None)

    def delete_node(self, name: str) -> None:
        self._node_digests.pop(name, None)
        self.node_facts.pop(name, None)
        self._forget_rejected(name)
        if self.nodes.pop(name, None) is not None:
            self.addresses.pop(name, None)
            self._dirty = True
        self._touch()

    def replace_nodes(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        """A full list: nodes not in it are gone."""
        for _ in self.replace_nodes_in_slices(nodes):
            pass

    def replace_nodes_in_slices(self, nodes: Iterable[Mapping[str, Any]], size: int = RELIST_SLICE) -> Iterator[None]:
        """``replace_nodes``, pausing (yielding) after every ``size`` nodes so that the caller can let
        the event loop serve requests; the nodes that the list no longer has go at the end, in one
        step. Between two slices the cache holds the old versions of the nodes not applied yet, as
        between two watch events."""
        seen = set()
        for i, node in enumerate(nodes):
            if i and i % size == 0:
                yield
            self.set_node(node)
            name = identity(node)[1]
            if name:
                seen.add(name)
        for name in list(self.nodes):
            if name not in seen:
                self.delete_node(name)
        for name in [n for n in self.rejected_nodes if n not in seen]:
            self._forget_rejected(name)
        self.synced["nodes"] = True

    # -- pods -------------------------------------------------------------------------------------
    def set_pod(self, pod: Mapping[str, Any]) -> None:
        """A pod was added or changed (the watch).

        A version that cannot be read is logged once, counted and ignored: a pending pod leaves
        ``pending`` (bind then reads it afresh and refuses it with the reason; filter answers it
        unschedulable), a pod holding resources keeps its last readable entry. A version whose read
        parts are those of the last one applied (a status update) only refreshes the resourceVersion;
        one whose read parts are those of the last one rejected is skipped (logged and counted already)."""
        digest = pod_digest(pod)
        if digest is not None and self._pod_digests.get(digest[0]) == digest[3]:
            self._touch()
            uid, rv, phase = digest[0], digest[1], digest[2] or ""
            info = self.pending.get(uid)
            if info is not None and (info.resource_version != rv or info.phase != phase):
                self.pending[uid] = replace(info, resource_version=rv, phase=phase)
            return
        if digest is not None and self._rejected_pods.get(digest[0]) == digest[3]:
            self._touch()  # a status update of an unusable version: nothing it was refused for changed
            return
        try:
            info = pod_info(pod, self.gpu, "pod")
        except Exception as exc:  # noqa: BLE001 - any failure on one object: log once, count, ignore
            self.stats.pod_errors += 1
            self.rejections.reject("Pod", pod, exc)
            uid = identity(pod)[2]
            if uid:
                self._pod_digests.pop(uid, None)
                self.pending.pop(uid, None)
                self._drop_rules(uid)
                self._remember_rejected_pod(uid, digest[3] if digest is not None and digest[0] == uid else None)
            return
        self.observe(info)
        if not info.node_name and not info.terminal and self._wants_rules(info):
            try:
                self.pod_rules[info.uid] = pod_rules(pod)
            except Exception as exc:  # noqa: BLE001 - filter answers it unschedulable, bind refuses it
                self.rules_problems[info.uid] = short_reason(exc)
                self.unreserve(info.uid)  # a provisional hold from before the watch saw it: bind would refuse
                self.rejections.reject(
                    "Pod", pod, exc, "kept unschedulable (its placement rules cannot be read; bind refuses it)"
                )
        if digest is None or digest[0] != info.uid:
            return
        if info.uid in self.pending or info.uid in self.pods:
            # Applied (unschedulable rules included: the same content again would fail the same way).
            self._pod_digests[info.uid] = digest[3]
        elif not info.terminal:  # refused by observe: bound, and what it holds cannot be read at all
            self._remember_rejected_pod(info.uid, digest[3])

    def _remember_rejected_pod(self, uid: str, digest: bytes | None) -> None:
        """Keep the digest of pod ``uid``'s unusable version (None: not plain enough to tell)."""
        if digest is None:
            self._rejected_pods.pop(uid, None)
            return
        self._rejected_pods[uid] = digest
        self._rejected_pods.move_to_end(uid)
        while len(self._rejected_pods) > MAX_REJECTED_PODS:
            self._rejected_pods.popitem(last=False)

    def _wants_rules(self, info: PodInfo) -> bool:
        return self.scheduler_name is None or info.scheduler_name == self.scheduler_name

    def _drop_rules(self, uid: str) -> None:
        """Forget a pod's placement rules, or why they could not be read."""
        self.pod_rules.pop(uid, None)
        self.rules_problems.pop(uid, None)

    def observe(self, info: PodInfo) -> None:
        """Apply what the API server says about a pod."""
        self._touch()
        self._pod_digests.pop(info.uid, None)  # set_pod records the version it applies
        self._rejected_pods.pop(info.uid, None)  # a readable version supersedes an unusable one
        if info.terminal:
            self.forget(info.uid)
            return
        entry = self.pods.get(info.uid)
        self._drop_rules(info.uid)  # set_pod puts them back for a pending pod
        if not info.node_name:
            self.pending[info.uid] = info
            # A pod we are binding, or whose binding outcome is unknown, keeps its reservation.
            if entry is not None and entry.status == BOUND:
                self.forget(info.uid)  # cannot happen (nodeName is immutable); be safe
            return
        self.pending.pop(info.uid, None)
        spec = info.spec
        if spec is None:
            # Bound (by another scheduler: ours refuses such pods) with a GPU request we cannot read:
            # it runs all the same, so count the most it can hold (PodInfo.held), or nothing if
            # even that cannot be read. Logged once per version and counted (reason gpu-request).
            self.stats.pod_errors += 1
            counted = (
                f"on {info.node_name} counted as {info.held.num_gpu} whole card(s) and its cpu and memory"
                if info.held is not None
                else f"on {info.node_name} not counted (its cpu and memory cannot be read either)"
            )
            self.rejections.reject("Pod", _metadata(info), PodRequestError(info.problem), counted)
            if info.held is None:
                self.forget(info.uid)
                return
            spec = info.held
        if entry is not None:
            if (
                entry.node == info.node_name
                and entry.spec == spec
                and (
                    info.cards is None
                    or info.cards == entry.cards
                    # A running pod's devices were given to its containers when they started: an edited
                    # card annotation does not move them, so the accounting does not move either.
                    or (entry.status == BOUND and entry.placement is not None)
                )
            ):
                if entry.status == BOUND:
                    return
                entry.status, entry.since = BOUND, self.clock()
                if entry.placement is not None or self._state is None:
                    return
                # Confirmed running but not counted (a rebuild could not fit our bind's pod): count it
                # as the running pod it is, as below.
                cards = info.cards if info.cards is not None else entry.cards
                self.forget(info.uid)
                self.add(info.uid, info.key, info.node_name, spec, cards, BOUND)
                return
            self.forget(info.uid)  # moved, resized or re-carded before it was placed: place afresh
        cards = info.cards if info.cards is not None else ()
        self.add(info.uid, info.key, info.node_name, spec, cards, BOUND)

    def delete_pod(self, uid: str) -> None:
        self._touch()
        self._rejected_pods.pop(uid, None)
        self.forget(uid)

    def replace_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """A full list: pods not in it are gone — except those our bind reserved and the list does
        not know yet (their status is not BOUND); those follow their own rules."""
        for _ in self.replace_pods_in_slices(pods):
            pass

    def replace_pods_in_slices(self, pods: Iterable[Mapping[str, Any]], size: int = RELIST_SLICE) -> Iterator[None]:
        """``replace_pods``, pausing (yielding) after every ``size`` pods (see
        ``replace_nodes_in_slices``); what the list no longer has is settled at the end, in one step."""
        seen = set()
        self.relisting = True  # the extender's room check waits for the end (rlsched.extender.refused)
        try:
            for i, pod in enumerate(pods):
                if i and i % size == 0:
                    yield
                self.set_pod(pod)
                uid = identity(pod)[2]
                if uid:
                    seen.add(uid)
            now = self.clock()
            gone = [
                u
                for u, e in self.pods.items()
                if u not in seen and (e.status == BOUND or (e.bind_done and now - e.since > 5.0))
            ]
            gone += [u for u, e in self.pods.items() if u not in seen and e.status == RESERVED]  # a hold for a gone pod
            for uid in gone:
                self.forget(uid)
            # Bound by us moments ago and not in the list: the list may predate the binding, or the pod
            # was deleted before it (no event will say so now). The watch confirms it within the
            # uncertain TTL, or its cards are released then (expire_uncertain).
            for e in self.pods.values():
                if e.uid not in seen and e.status == ASSUMED and e.bind_done:
                    e.status, e.since = UNCERTAIN, now
            for uid in [u for u in self.pending if u not in seen]:
                del self.pending[uid]
                self._drop_rules(uid)
                self._pod_digests.pop(uid, None)
            for uid in [u for u in self._rejected_pods if u not in seen]:
                del self._rejected_pods[uid]
            self.synced["pods"] = True
        finally:
            self.relisting = False

    # -- placing ----------------------------------------------------------------------------------
    def add(
        self, uid: str, key: str, node: str, spec: PodSpec, cards: tuple[int, ...], status: str, exact: bool = False
    ) -> Entry:
        """Record a pod on ``node`` and place it in the state (cards checked; the default rule when
        they are missing or do not fit). An entry that cannot be placed is kept and reported.

        ``exact`` (bind's reservations): exactly these cards or no placement, silently — the caller
        drops the entry and answers the error."""
        if uid in self.pods:
            self.forget(uid)
        if self._dirty:
            self._rebuild()
        entry = Entry(uid, key, node, spec, tuple(cards), status, self.clock())
        self.pods[uid] = entry
        if self._state is None:
            return entry
        if status == BOUND and not exact:
            # Running there (on these cards, when it has them): reality goes before filter's
            # reservations, which are only holds — released when they are in the way, and this pod
            # placed before any other entry of the node that did not fit gets the room.
            self._place(entry, exact=bool(entry.cards), quiet=True)
            released = entry.placement is None and node in self._state.index and self._unreserve_on(node)
            if released:
                self._place(entry, exact=bool(entry.cards), quiet=True)
            if entry.placement is None:  # short of cpu or memory in our view: it runs there all the same
                self._place(entry, exact=bool(entry.cards), quiet=True, overcommit=True)
            if entry.placement is None:
                self._place(entry, overcommit=True)
            if released:
                self._retry_unplaced(node)
        else:
            self._place(entry, exact)
        return entry

    def _unreserve_on(self, node: str) -> bool:
        """Release filter's reservations on ``node`` (their binds will check afresh) without placing
        anything else meanwhile (the caller does); True if any. Called when a running pod does not
        fit its node: the holds come from :meth:`_reserved` of that node, not a scan of every pod or
        every hold (a flood of pods pinned to a node past its room cost one scan each)."""
        held = [e.uid for e in self._reserved(node)]
        self._retry_paused = True
        try:
            for uid in held:
                self.unreserve(uid)
        finally:
            self._retry_paused = False
        return bool(held)

    def _mark_unplaced(self, entry: Entry) -> None:
        self._unplaced.setdefault(entry.node, {})[entry.uid] = None

    def _mark_placed(self, entry: Entry) -> None:
        uids = self._unplaced.get(entry.node)
        if uids is not None:
            uids.pop(entry.uid, None)
            if not uids:
                del self._unplaced[entry.node]

    def forget(self, uid: str) -> Entry | None:
        """Release a pod's resources and drop it."""
        self._pod_digests.pop(uid, None)
        self.pending.pop(uid, None)
        self._drop_rules(uid)
        entry = self.pods.pop(uid, None)
        if entry is not None:
            held = entry.placement is not None
            self._mark_placed(entry)
            self._release(entry)
            if held and self.on_departure is not None:
                self.on_departure(entry.node)
        return entry

    def release(self, uid: str) -> Entry | None:
        """Release a pod's hold or reservation and drop its entry, the pod itself staying known as
        pending (a bind that failed, a binding outcome that stayed unknown): unlike :meth:`forget`,
        which is for a pod that is gone, its next filter may hold cards for it at once."""
        entry = self.pods.pop(uid, None)
        if entry is not None:
            self.provisional_live.pop(uid, None)
            self._mark_placed(entry)
            self._release(entry)
        return entry

    def count_running(self, uid: str) -> None:
        """Count the entry of ``uid`` now that it may run (our binding written, or its outcome
        unknown), if a node change during the write left it unplaced: as :meth:`add` counts a running
        pod, whatever its cpu and memory. Without this, its cards read as free until the watch
        confirmed it, or for the whole TTL of an unknown outcome, and went to another pod."""
        entry = self.pods.get(uid)
        if entry is None or entry.placement is not None or self._state is None or not running(entry):
            return
        self._place_again(entry)

    def _place_again(self, entry: Entry) -> bool:
        """Place an unplaced entry, counted as the running pod it may be: on its own cards when it
        has them and they are free, else by the default rule (:func:`_fit` tries them in that order);
        whether it is placed (quietly)."""
        return self._place(entry, quiet=True, overcommit=True)

    def _release(self, entry: Entry) -> None:
        """Give the entry's placement back to the state. Released even while a rebuild is pending:
        the old state stays exact, and the rebuild carries its unchanged nodes over as they are."""
        if entry.placement is not None and self._state is not None:
            try:
                self._state.release(entry.placement)
            except ValueError as exc:  # pragma: no cover - would be a bug in the bookkeeping
                log.error("release of %s failed: %s; rebuilding", entry.key, exc)
                self._dirty = True
            self.generation += 1
            entry.placement = None
            if entry.node in self._unplaced and not self._retry_paused:
                self._retry_unplaced(entry.node)

    def retry_unplaced(self) -> None:
        """Try every uncounted pod of the nodes whose releases tried only the first
        :data:`RETRY_PER_RELEASE` (called every few seconds)."""
        nodes, self._retry_later = self._retry_later, set()
        for node in nodes:
            if self._state is not None and node in self._state.index:
                self._retry_unplaced(node, limit=None)

    def _retry_unplaced(self, node: str, limit: int | None = RETRY_PER_RELEASE) -> None:
        """Place again the entries on ``node`` that did not fit (their node just freed something):
        running pods first, each on its own cards when it has them, else by the default rule; only
        the ``limit`` first found uncounted (the rest at the next :meth:`retry_unplaced`)."""
        uids = self._unplaced.get(node, {})
        if limit is not None and len(uids) > limit:
            uids = dict.fromkeys(itertools.islice(uids, limit))
            self._retry_later.add(node)
        waiting = sorted((self.pods[u] for u in uids if u in self.pods), key=_retry_order)
        for entry in waiting:
            if entry.status == RESERVED or entry.placement is not None:
                continue
            if self._place_again(entry):
                log.info(
                    "pod %s on %s counted again: its node has room now",
                    entry.key,
                    entry.node,
                    extra={"event": "pod_placed_late", "pod": entry.key, "node": entry.node},
                )

    def _place(self, entry: Entry, exact: bool = False, quiet: bool = False, overcommit: bool = False) -> bool:
        """Place ``entry`` in the state (its cards, else the default rule unless ``exact``); whether
        it is placed. A failure is logged and counted unless ``exact`` or ``quiet``. ``overcommit``
        (a :func:`running` pod only): whatever its cpu, memory and GPU model — a node's allocatable
        can shrink under it, MiB rounding can overfill a node that is exactly full in bytes, its
        node's model label can change; uncounted, its cards would look free."""
        state = self._state
        assert state is not None
        entry.placement = None
        self._mark_unplaced(entry)
        if entry.node not in state.index:
            entry.problem = f"node {entry.node} is not in the cache"
            return False
        placement, cards, entry.problem = _fit(state, entry, exact, overcommit)
        if placement is not None:
            entry.placement, entry.cards = placement, cards
            self._mark_placed(entry)
            self.generation += 1
            return True
        if exact or quiet:
            return False
        self.stats.unplaceable += 1
        log.warning(
            "pod %s on %s does not fit the cached node (%s); not counted",
            entry.key,
            entry.node,
            entry.problem,
            extra={"event": "pod_unplaceable", "pod": entry.key, "node": entry.node},
        )
        return False

    def nominated_ahead_of(self, pod: PodInfo, nodes: Iterable[str] | None = None) -> dict[str, list[PodInfo]]:
        """The pending pods nominated to a node (of ``nodes``; any when None) that kube-scheduler's
        filters count there before ``pod`` (``RunFilterPluginsWithNominatedPods``): of at least its
        priority and not ``pod`` itself; by node, the highest priority first. Only those holding
        nothing yet (a hold or a bind is counted already) and readable. From the index of nominated
        pods (``PendingPods``), not a scan of the pending pods: filter asks at every pod."""
        index = self.pending.nominated
        if not index:
            return {}
        out: dict[str, list[PodInfo]] = {}
        for node in index if nodes is None else (n for n in set(nodes) if n in index):
            ahead = [
                p
                for p in index[node].values()
                if p.uid != pod.uid and p.priority >= pod.priority and p.spec is not None and p.uid not in self.pods
            ]
            if ahead:
                ahead.sort(key=lambda p: -p.priority)
                out[node] = ahead
        return out

    def uncounted(self, node: str) -> list[Entry]:
        """The entries on ``node`` the state does not count, in the order a release there counts
        them again (:meth:`_retry_unplaced`: running pods first, then the oldest; holds never)."""
        found = (self.pods.get(u) for u in self._unplaced.get(node, {}))
        return sorted(
            (e for e in found if e is not None and e.status != RESERVED and e.placement is None), key=_retry_order
        )

    def _rebuild(self) -> None:
        start = time.perf_counter()
        self._dirty = False
        self.epoch += 1
        self.generation += 1
        if not self.nodes:
            self._state = None
            self._tiebreak = TieBreak.by_name([], self.seed)
            for e in self.pods.values():
                e.placement = None
            return
        specs = [self.nodes[name] for name in sorted(self.nodes)]
        old = self._state
        state = ClusterState(specs)
        self._state = state
        self._tiebreak = TieBreak.by_name(state.names, self.seed)
        carried = _carry_over(old, state)
        # Pods on carried nodes keep their cards (same node, same capacity); the others are placed
        # again: running pods first (what is there), then our binds (written, or maybe written), then
        # filter's reservations, exactly or not at all (a hold that no longer fits is dropped: its
        # bind checks afresh).
        replaced = []
        for entry in self.pods.values():
            p = entry.placement
            if p is not None and entry.node in carried:
                entry.placement = Placement(
                    state.index[entry.node],
                    p.cards,
                    p.milli_per_card,
                    p.cpu_milli,
                    p.memory_mib,
                    p.kind,
                    p.latency_sensitive,
                )
            else:
                replaced.append((entry, p is None and bool(entry.problem)))  # tried, and did not fit
        order = {BOUND: 0, ASSUMED: 1, UNCERTAIN: 1, RESERVED: 2}
        for entry, uncounted in sorted(replaced, key=lambda r: (order.get(r[0].status, 1), r[0].since)):
            if entry.status == RESERVED:
                self._place(entry, exact=True)
                if entry.placement is None:
                    del self.pods[entry.uid]
                    self._mark_placed(entry)
            else:  # a running pod counts whatever it asked; one that did not fit before was logged and counted
                self._place(entry, quiet=uncounted, overcommit=True)
        for name, row in self._load.items():
            i = state.index.get(name)
            if i is not None:
                state.load[i] = row
        self.stats.rebuilds += 1
        self.stats.last_rebuild_s = time.perf_counter() - start
        log.info(
            "cluster state rebuilt: %d nodes (%d carried over), %d pods (%d placed again) in %.1f ms",
            state.num_nodes,
            len(carried),
            len(self.pods),
            len(replaced),
            self.stats.last_rebuild_s * 1e3,
            extra={"event": "state_rebuilt"},
        )

    # -- load -------------------------------------------------------------------------------------
    def set_load(self, load: Mapping[str, np.ndarray]) -> None:
        """Per-node utilization rows (``LOAD_METRICS`` order, NaN unknown); nodes absent → all NaN.

        Rows that change bump the node's ``node_version`` so per-node feature caches refresh.
        """
        self._load = {k: np.asarray(v, dtype=np.float64) for k, v in load.items()}
        state = self._state
        if state is None or self._dirty:
            return
        new = np.full_like(state.load, np.nan)
        for name, row in self._load.items():
            i = state.index.get(name)
            if i is not None:
                new[i] = row
        changed = ~((new == state.load) | (np.isnan(new) & np.isnan(state.load))).all(axis=1)
        if changed.any():
            state.load[:] = new
            state.node_version[changed] += 1
            self.generation += 1

    # -- maintenance ------------------------------------------------------------------------------
    def expire_reserved(self, ttl_s: float) -> list[str]:
        """Release filter's reservations that no bind followed within ``ttl_s`` (kube-scheduler chose
        otherwise, a later plugin or permit failed, or the pod went away unseen)."""
        now = self.clock()
        expired = [e.uid for e in self._reserved() if now - e.since > ttl_s]
        for uid in expired:
            self.unreserve(uid)
        return expired

    def _reserved(self, node: str | None = None) -> list[Entry]:
        """The entries holding filter's reservations (status RESERVED) on ``node``, or on every node;
        forgets the UIDs that no longer do."""
        live: list[Entry] = []
        for name in [node] if node is not None else list(self._maybe_reserved):
            here = [
                e
                for u in self._maybe_reserved.pop(name, ())
                if (e := self.pods.get(u)) is not None and e.status == RESERVED and e.node == name
            ]
            if here:
                self._maybe_reserved[name] = {e.uid for e in here}
            live += here
        return live

    def reserve(self, info: PodInfo, node: str, cards: tuple[int, ...], provisional: bool = False) -> bool:
        """Hold ``cards`` on ``node`` for the pending pod ``info`` (filter's decision); False when they
        cannot be taken (then nothing is held).

        ``provisional``: the watch has not seen the pod yet (kube-scheduler's informer often sees a
        new pod first). The hold is released PROVISIONAL_HOLD_S after the first one unless the watch
        shows a pending pod of ours under that UID and name by then (:meth:`expire_provisional`); at
        most MAX_PROVISIONAL_HOLDS at once, and a pod is held so only once: a made-up or stale request
        pins little, briefly."""
        if info.spec is None or info.uid in self.pods:  # a bind holds it already, or it is bound
            return False
        if provisional:
            first = self.provisional.get(info.uid)
            if first is not None and self.clock() - first > PROVISIONAL_HOLD_S:
                return False
            if len(self.provisional_live) >= MAX_PROVISIONAL_HOLDS:
                self._prune_provisional()  # holds bound or released since count no more
                if len(self.provisional_live) >= MAX_PROVISIONAL_HOLDS:
                    return False
        entry = self.add(info.uid, info.key, node, info.spec, cards, RESERVED, exact=True)
        self._maybe_reserved.setdefault(node, set()).add(info.uid)
        if entry.placement is None:
            self.unreserve(info.uid)
            return False
        if provisional:
            self.provisional_live[info.uid] = self.provisional.setdefault(info.uid, self.clock())
            while len(self.provisional) > MAX_PROVISIONAL_SEEN:
                self.provisional.popitem(last=False)
        return True

    def _confirmed(self, entry: Entry) -> bool:
        """Whether the watch shows the provisionally held pod: pending, ours, the same name."""
        known = self.pending.get(entry.uid)
        return known is not None and known.key == entry.key and self.scheduler_name in (None, known.scheduler_name)

    def _prune_provisional(self) -> None:
        """Forget the provisional holds that are no longer waiting for the watch: released, bound,
        or confirmed (their slot goes to the next pod at once, not at the next expiry tick)."""
        for uid in [
            u
            for u in self.provisional_live
            if (e := self.pods.get(u)) is None or e.status != RESERVED or self._confirmed(e)
        ]:
            del self.provisional_live[uid]

    def expire_provisional(self) -> list[str]:
        """Release the provisional holds (:meth:`reserve`) the watch did not confirm in time; a hold
        it confirmed (a pending pod of ours, same name) lives on as any other."""
        now = self.clock()
        expired = []
        self._prune_provisional()  # released, or bound meanwhile
        for uid, first in list(self.provisional_live.items()):
            if now - first > PROVISIONAL_HOLD_S:
                self.unreserve(uid)
                expired.append(uid)
        return expired

    def unreserve(self, uid: str) -> None:
        """Release filter's reservation for ``uid``, if it has one (the pod stays pending and known)."""
        entry = self.pods.get(uid)
        if entry is not None and entry.status == RESERVED:
            self.release(uid)

    def expire_uncertain(self, ttl_s: float) -> list[str]:
        """Release reservations whose binding outcome stayed unknown longer than ``ttl_s``."""
        now = self.clock()
        expired = [u for u, e in self.pods.items() if e.status == UNCERTAIN and now - e.since > ttl_s]
        for uid in expired:
            entry = self.release(uid)
            if entry is not None:
                log.warning(
                    "released cards of %s on %s: binding outcome unknown for %.0f s",
                    entry.key,
                    entry.node,
                    ttl_s,
                    extra={"event": "assumed_expired", "pod": entry.key, "node": entry.node},
                )
        return expired

    def summary(self) -> dict[str, Any]:
        """Sizes and ages for /status."""
        by_status: dict[str, int] = {}
        for e in self.pods.values():
            by_status[e.status] = by_status.get(e.status, 0) + 1
        state = self.state
        return {
            "ready": self.ready,
            "nodes": len(self.nodes),
            "gpuNodes": sum(1 for n in self.nodes.values() if n.gpu_count),
            "pods": len(self.pods),
            "podsByStatus": by_status,
            "pendingPods": len(self.pending),
            "rejectedObjects": dict(self.rejections.totals),
            "unplaceablePods": sum(1 for e in self.pods.values() if e.placement is None),
            "ageSeconds": None if not self.last_update else round(self.age_s(), 3),
            "epoch": self.epoch,
            "rebuilds": self.stats.rebuilds,
            "gpuMilliAllocated": state.gpu_milli_allocated if state is not None else 0,
            "gpuMilliCapacity": state.gpu_milli_capacity if state is not None else 0,
            "loadColumns": list(LOAD_METRICS),
        }

    def _touch(self) -> None:
        self.last_update = self.clock()


def _metadata(info: PodInfo) -> dict[str, Any]:
    """The metadata of the pod version ``info`` was read from, as :func:`~.rejections.identity` reads it."""
    return {
        "metadata": {
            "namespace": info.namespace,
            "name": info.name,
            "uid": info.uid,
            "resourceVersion": info.resource_version,
        }
    }


def _digest(parts: tuple[Any, ...]) -> bytes | None:
    try:
        return hashlib.blake2b(orjson.dumps(parts), digest_size=16).digest()
    except (TypeError, orjson.JSONEncodeError):  # not plain JSON data: no shortcut
        return None


def pod_digest(pod: Any) -> tuple[str, str, Any, bytes] | None:
    """(UID, resourceVersion, phase, digest of what :func:`~.objects.pod_info` and
    :func:`~.node_rules.pod_rules` read: namespace, name, labels, annotations, spec, the QoS class,
    the nominated node (a status write of kube-scheduler's preemption that preempt's trial reads),
    whether the phase is terminal — kwok's Pending → Running is not a change); None when the object
    is not plain enough to tell (it then takes the full path, errors included)."""
    if type(pod) is not dict:
        return None
    meta, status = pod.get("metadata"), pod.get("status")
    if type(meta) is not dict or (status is not None and type(status) is not dict):
        return None
    uid, rv = meta.get("uid"), meta.get("resourceVersion")
    if type(uid) is not str or not uid or type(rv) is not str:
        return None
    phase = status.get("phase") if status is not None else None
    if phase is not None and type(phase) is not str:
        return None
    terminal = phase in ("Succeeded", "Failed")
    qos = status.get("qosClass") if status is not None else None
    nominated = status.get("nominatedNodeName") if status is not None else None
    digest = _digest(
        (
            meta.get("namespace"),
            meta.get("name"),
            meta.get("labels"),
            meta.get("annotations"),
            pod.get("spec"),
            qos,
            nominated,
            terminal,
        )
    )
    return None if digest is None else (uid, rv, phase, digest)


def node_digest(node: Any) -> tuple[str, bytes] | None:
    """(name, digest of what :func:`~.objects.node_spec`, :func:`~.node_rules.node_facts` and
    :func:`~.objects.node_addresses` read: labels, annotations, spec, allocatable, capacity,
    addresses) — not the conditions and heartbeats; None when the object is not plain enough."""
    if type(node) is not dict:
        return None
    meta, status = node.get("metadata"), node.get("status")
    if type(meta) is not dict or (status is not None and type(status) is not dict):
        return None
    name = meta.get("name")
    if type(name) is not str or not name:
        return None
    st = status or {}
    digest = _digest(
        (
            meta.get("labels"),
            meta.get("annotations"),
            node.get("spec"),
            st.get("allocatable"),
            st.get("capacity"),
            st.get("addresses"),
        )
    )
    return None if digest is None else (name, digest)


def _fit(
    state: ClusterState, entry: Entry, exact: bool, overcommit: bool
) -> tuple[Placement | None, tuple[int, ...], str]:
    """Place ``entry`` in ``state`` as :meth:`ClusterCache._place` does, leaving ``entry`` as it is:
    (the placement or None, the cards it took, why it did not fit)."""
    idx = state.index.get(entry.node)
    if idx is None:
        return None, entry.cards, f"node {entry.node} is not in the cache"
    req = state.request(entry.spec)
    problem = entry.problem  # kept when nothing is tried (exact, without cards)
    tried = []
    if entry.cards or not req.is_gpu:
        tried.append(entry.cards)
    if not exact:
        try:
            tried.append(default_cards(state, req, idx))
        except ValueError as exc:
            problem = str(exc)
    runs = running(entry)
    for cards in tried:
        try:
            placement = state.place(req, idx, cards, overcommit=overcommit and runs, any_model=runs)
            return placement, tuple(cards), ""
        except ValueError as exc:
            problem = str(exc)
    return None, entry.cards, problem


def fit_again(state: ClusterState, entry: Entry) -> bool:
    """Count an uncounted ``entry`` in ``state`` (a trial copy: the entry and the cache stay as they
    are) as a release of its node would (:meth:`ClusterCache._place_again`); whether it fits."""
    return _fit(state, entry, exact=False, overcommit=True)[0] is not None


def place_nominated(state: ClusterState, nominated: dict[str, list[PodInfo]]) -> list[int]:
    """Count ``nominated`` (:meth:`ClusterCache.nominated_ahead_of`) on their nodes in ``state`` (a
    trial copy), in the order given; the indices of the nodes that took one. Each is placed by the
    default card rule where it fits; where it does not yet (its victims are still leaving: they
    hold their cards until they are gone), it holds the room it could use of what is free
    (:meth:`ClusterState.hold`), as kube-scheduler adds a nominated pod to its node whether it fits
    or not. The cards its own decision takes later may differ."""
    touched = []
    for node, pods in nominated.items():
        i = state.index.get(node)
        if i is None:
            continue
        for pod in pods:
            assert pod.spec is not None  # nominated_ahead_of keeps readable pods only
            req = state.request(pod.spec)
            try:
                state.place(req, i, default_cards(state, req, i))
            except ValueError:
                try:
                    state.hold(req, i)
                except ValueError:  # past what a node's totals can count: the node reads as full anyway
                    continue
            touched.append(i)
    return touched


def _retry_order(entry: Entry) -> tuple[bool, float]:
    """Uncounted pods are tried again running pods first, then the oldest first."""
    return (entry.status != BOUND, entry.since)


def _carry_over(old: ClusterState | None, new: ClusterState) -> set[str]:
    """Copy the per-node rows of nodes whose spec did not change from ``old`` into ``new``.

    A full re-placement of every pod costs ~25 µs a pod (5,000 nodes, 11,500 pods: 285 ms with the
    event loop blocked); copying rows is a few vectorized assignments. Rows are the state's mutable
    per-node arrays (the ones ``ClusterState.copy`` copies); card columns are matched up to the
    narrower of the two states (a node's cards never exceed either width). Returns the carried names.
    """
    if old is None:
        return set()
    pairs = [
        (i, old.index[name])
        for i, name in enumerate(new.names)
        if name in old.index and old.nodes[old.index[name]] is new.nodes[i]
    ]  # the same NodeSpec object
    if not pairs:
        return set()
    new_idx = np.fromiter((a for a, _ in pairs), dtype=np.int64, count=len(pairs))
    old_idx = np.fromiter((b for _, b in pairs), dtype=np.int64, count=len(pairs))
    for attr in MUTABLE_ARRAYS:
        src, dst = getattr(old, attr), getattr(new, attr)
        if src.ndim == 1:
            dst[new_idx] = src[old_idx]
        else:
            width = min(src.shape[1], dst.shape[1])
            dst[new_idx, :width] = src[old_idx, :width]
    return {new.names[i] for i in new_idx.tolist()}
