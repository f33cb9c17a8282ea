"""Pods filter refused moments before its watch saw room free, so that they are retried at once.

kube-scheduler retries an unschedulable pod at a cluster event that comes after the refusal. Its
informer and the extender's watch see the same events, but not at the same instant: when a pod's
deletion reaches kube-scheduler first, it tries the pods waiting for room, and filter, whose watch has
not delivered the deletion yet, refuses them on a view a few milliseconds old. The deletion was the
event that would have retried them, so they wait for the next unrelated one — in a quiet cluster,
kube-scheduler's 5-minute flush (seen on the local control plane while many pods were deleted at
once). :class:`RefusedPods` keeps the pods filter refused within the last :data:`RACE_WINDOW_S`, with
the nodes kube-scheduler offered; when the cache lets a pod go (deleted, finished), the extender
checks them against that pod's node once the watch event is applied (:meth:`RefusedPods.fitting`),
and a pod that fits there now gets a ``room`` record in the decision ring, which the operator answers
with a requeue (``Requeuer.on_room``, docs/operator.md). A pod refused longer ago needs none of this:
kube-scheduler saw the departure after the refusal and retries it itself.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from rlsched.policy.cluster import ClusterState, PodSpec
from rlsched.policy.feasibility import feasible_mask

from .node_rules import NodeFacts, PodRules, refusal
from .objects import PodInfo

RACE_WINDOW_S = 1.0
"""How long after a refusal a departure from a node that would fit the pod counts as one the refusal
did not see (seconds): the two watches are milliseconds apart."""

MAX_REFUSED = 64
"""Pods remembered at most (the newest kept): refusals within one window."""


@dataclass(frozen=True)
class Refused:
    info: PodInfo
    at: float
    epoch: int
    """The cache's epoch of ``offered``: node indices of another epoch mean nothing."""
    offered: np.ndarray
    """The node indices kube-scheduler offered (sorted): its own filters ruled the others out."""


class RefusedPods:
    """UID → :class:`Refused`, within :data:`RACE_WINDOW_S`, at most :data:`MAX_REFUSED`."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._pods: OrderedDict[str, Refused] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pods)

    def add(self, info: PodInfo, epoch: int, offered: np.ndarray) -> None:
        self._pods[info.uid] = Refused(info, self.clock(), epoch, offered)
        self._pods.move_to_end(info.uid)
        while len(self._pods) > MAX_REFUSED:
            self._pods.popitem(last=False)

    def drop(self, uid: str) -> None:
        self._pods.pop(uid, None)

    def fitting(
        self,
        state: ClusterState,
        epoch: int,
        nodes: Iterable[int],
        rules: Mapping[str, PodRules],
        facts: Callable[[int], NodeFacts | None],
    ) -> list[tuple[PodInfo, int]]:
        """The remembered pods that fit one of ``nodes`` now, each with the first such node it was
        offered — by the cards, cpu and memory (one vectorized check per distinct request), and by
        its placement rules when the cache has them (``rules`` by UID, ``facts`` a node's labels and
        taints by index) — taken out of the memory; the expired ones, and those refused in another
        ``epoch`` (their offered indices name other nodes now), are dropped."""
        now = self.clock()
        while self._pods and now - next(iter(self._pods.values())).at > RACE_WINDOW_S:
            self._pods.popitem(last=False)
        if not self._pods:
            return []
        freed = np.unique(np.fromiter(nodes, dtype=np.int64))
        masks: dict[PodSpec, np.ndarray] = {}
        found = []
        for uid, refused in list(self._pods.items()):
            spec = refused.info.spec
            if spec is None or refused.epoch != epoch:  # the nodes it was offered are other indices now
                del self._pods[uid]
                continue
            shape = replace(spec, name="")  # one mask per request, whoever asks it
            mask = masks.get(shape)
            if mask is None:
                mask = masks[shape] = feasible_mask(state, state.request(spec))
            where = freed[mask[freed]]
            offered = refused.offered
            pos = np.minimum(np.searchsorted(offered, where), max(len(offered) - 1, 0))
            where = where[offered[pos] == where] if len(offered) else where[:0]
            own = rules.get(uid)
            for node in where.tolist():
                node_facts = facts(node) if own is not None else None
                if own is None or (node_facts is not None and refusal(own, node_facts) is None):
                    found.append((refused.info, node))
                    del self._pods[uid]
                    break
        return found
