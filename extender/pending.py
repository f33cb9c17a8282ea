"""The pods without a node, by UID, and which of them kube-scheduler has nominated to a node.

When kube-scheduler's preemption evicts pods for a preemptor, it writes the node it made room on to
the preemptor's ``status.nominatedNodeName``, and its own filters count that pod on the node for every
pod of no higher priority until the preemptor is bound (``RunFilterPluginsWithNominatedPods``). Card
shares are an ignored resource to kube-scheduler, so the extender's filter must count them itself, and
it must find a node's nominated pods without a scan of every pending pod: filter runs once per pod,
and a backlog holds thousands. :class:`PendingPods` is the ``dict`` of pending pods with that index
kept beside it, in step with every write.
"""

from __future__ import annotations

from typing import Any, NoReturn

from .objects import PodInfo


class PendingPods(dict[str, PodInfo]):
    """UID → the watch's reading of a pod without a node; ``nominated`` indexes those with a
    ``nominated_node``. Reads are the plain ``dict``'s; the writes the cache uses (``[uid] = info``,
    ``del``, ``pop``) keep the index; the others are refused rather than left to bypass it."""

    def __init__(self) -> None:
        super().__init__()
        self.nominated: dict[str, dict[str, PodInfo]] = {}
        """Node name → UID → the pending pod nominated to it (the node's dict dropped when empty)."""

    def __setitem__(self, uid: str, info: PodInfo) -> None:
        old = dict.get(self, uid)
        if old is not None:
            self._unindex(uid, old)
        dict.__setitem__(self, uid, info)
        if info.nominated_node:
            self.nominated.setdefault(info.nominated_node, {})[uid] = info

    def __delitem__(self, uid: str) -> None:
        info = dict.pop(self, uid)
        self._unindex(uid, info)

    def pop(self, uid: str, *default: Any) -> Any:
        if uid not in self:
            return dict.pop(self, uid, *default)
        info = dict.pop(self, uid)
        self._unindex(uid, info)
        return info

    def _unindex(self, uid: str, info: PodInfo) -> None:
        node = info.nominated_node
        if not node:
            return
        on_node = self.nominated.get(node)
        if on_node is not None:
            on_node.pop(uid, None)
            if not on_node:
                del self.nominated[node]

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("PendingPods is changed by [uid] = info, del and pop only (they keep the nominated index)")

    clear = update = setdefault = popitem = __ior__ = _refuse
