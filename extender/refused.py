"""Pods filter refused moments before its watch saw room free, so that they are retried at once.

kube-scheduler retries an unschedulable pod at a cluster event that comes after the refusal. Its
informer and the extender's watch see the same events, but not at the same instant: when a pod's
deletion reaches kube-scheduler first, it tries the pods waiting for room, and filter, whose watch has
not delivered the deletion yet, refuses them on a view a few milliseconds old. The deletion was the
event that would have retried them, so they wait for the next unrelated one — in a quiet cluster,
kube-scheduler's 5-minute flush (seen on the local control plane while many pods were deleted at
once). :class:`RefusedPods` keeps the pods filter refused within the last :data:`RACE_WINDOW_S`;
when the cache releases room on a node where one of them now fits, the extender writes a ``room``
record to its decision ring, and the operator requeues the pod as it requeues a delayed one
(``Requeuer.on_room``, docs/operator.md). A pod refused longer ago needs none of this: kube-scheduler
saw the release after the refusal and retries it itself.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from rlsched.policy.cluster import ClusterState
from rlsched.policy.feasibility import infeasibility_reason

from .node_rules import NodeFacts, PodRules, refusal
from .objects import PodInfo

RACE_WINDOW_S = 1.0
"""How long after a refusal a release on a node that would fit the pod counts as the release the
refusal did not see (seconds): the two watches are milliseconds apart."""

MAX_REFUSED = 256
"""Pods remembered at most (the newest kept): refusals within one window."""


class RefusedPods:
    """UID → (the pod filter refused, when), within :data:`RACE_WINDOW_S`, at most :data:`MAX_REFUSED`."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._pods: OrderedDict[str, tuple[PodInfo, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pods)

    def add(self, info: PodInfo) -> None:
        self._pods[info.uid] = (info, self.clock())
        self._pods.move_to_end(info.uid)
        while len(self._pods) > MAX_REFUSED:
            self._pods.popitem(last=False)

    def drop(self, uid: str) -> None:
        self._pods.pop(uid, None)

    def fitting(
        self, state: ClusterState, node: int, rules: dict[str, PodRules], facts: NodeFacts | None
    ) -> list[PodInfo]:
        """The pods refused within the window that fit ``node`` now — by the cards, cpu and memory and
        by their placement rules when the cache has them (``rules`` by UID, ``facts`` the node's
        labels and taints) — taken out of the memory; the expired ones are dropped."""
        now = self.clock()
        while self._pods and now - next(iter(self._pods.values()))[1] > RACE_WINDOW_S:
            self._pods.popitem(last=False)
        found = []
        for uid, (info, _) in list(self._pods.items()):
            spec = info.spec
            if spec is None or infeasibility_reason(state, state.request(spec), node, detail=False):
                continue
            own = rules.get(uid)
            if own is not None and (facts is None or refusal(own, facts) is not None):
                continue
            found.append(info)
            del self._pods[uid]
        return found
