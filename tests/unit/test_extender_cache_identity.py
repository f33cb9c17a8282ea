"""Every path keys an object the same way: the cache's entries, the watch's DELETED events and a
relist's "still there" set all read a pod's UID and a node's name with ``rejections.identity``.

A pod the cache kept under a stand-in key (no UID: "namespace/name") stayed holding its cards after
its DELETED event and was dropped, while running, by a relist that still listed it. Such objects are
refused as unreadable instead (logged once, counted), so no path can disagree about them."""

from __future__ import annotations

import copy
import logging

import pytest

from rlsched.extender.cache import ClusterCache
from rlsched.extender.objects import ObjectError, pod_info
from rlsched.extender.rejections import identity
from rlsched.extender.settings import GpuConventions
from rlsched.extender.testing import make_node, make_pod

GPU = GpuConventions()


def watched_cache() -> ClusterCache:
    c = ClusterCache(GPU)
    c.replace_nodes([make_node("n1", gpus=2), make_node("n2", gpus=2)])
    c.replace_pods([])
    return c


def apply_pod(c: ClusterCache, kind: str, pod: dict) -> None:
    """What the service's pod watch callback does with an event (server.Service._apply_pod)."""
    if kind == "DELETED":
        c.delete_pod(identity(pod)[2])
    else:
        c.set_pod(pod)


def without_uid(uid: object = None) -> dict:
    pod = make_pod("nouid", gpus=2, node="n1", uid="placeholder")
    if uid is None:
        del pod["metadata"]["uid"]
    else:
        pod["metadata"]["uid"] = uid
    return pod


@pytest.mark.parametrize("uid", [None, "", "u" * 300], ids=["missing", "empty", "longer-than-identity-reads"])
def test_a_bound_pod_whose_uid_other_paths_cannot_read_is_refused_not_kept_under_another_key(uid, caplog) -> None:
    c = watched_cache()
    pod = without_uid(uid)
    with caplog.at_level(logging.WARNING, logger="rlsched.extender.cache"):
        apply_pod(c, "ADDED", copy.deepcopy(pod))
        c.replace_pods([copy.deepcopy(pod)])  # a relist that has it: nothing held, nothing dropped
        apply_pod(c, "MODIFIED", copy.deepcopy(pod))
    assert c.pods == {} and c.pending == {} and c.state.gpu_milli_allocated == 0
    assert c.stats.pod_errors >= 1 and c.rejections.totals == {"Pod/field": 1}
    lines = [r for r in caplog.records if getattr(r, "event", "") == "object_rejected"]
    assert len(lines) == 1 and lines[0].field == "pod.metadata.uid"
    apply_pod(c, "DELETED", copy.deepcopy(pod))  # its DELETED event finds nothing to release, as it should
    assert c.pods == {} and c.state.gpu_milli_allocated == 0


def test_pod_info_requires_a_uid_bind_would_take() -> None:
    for uid in (None, "", "u" * 300, "has space"):
        with pytest.raises(ObjectError, match=r"^Pod\.metadata\.uid: "):
            pod_info(without_uid(uid), GPU)
    assert pod_info(without_uid("0b1c2d3e-aaaa-bbbb-cccc-1234567890ab"), GPU).uid == (
        "0b1c2d3e-aaaa-bbbb-cccc-1234567890ab"
    )


def test_a_pod_with_a_uid_is_released_by_its_deleted_event_and_kept_by_a_relist() -> None:
    c = watched_cache()
    pod = make_pod("p", gpus=2, node="n1", uid="u-p")
    apply_pod(c, "ADDED", copy.deepcopy(pod))
    c.replace_pods([copy.deepcopy(pod)])
    assert list(c.pods) == ["u-p"] and c.state.gpu_milli_allocated == 2000
    apply_pod(c, "DELETED", copy.deepcopy(pod))
    assert c.pods == {} and c.state.gpu_milli_allocated == 0


def test_a_node_name_longer_than_identity_reads_is_refused_not_dropped_by_every_relist() -> None:
    c = watched_cache()
    long_name = "n" * 300
    node = make_node(long_name, gpus=2)
    c.set_node(copy.deepcopy(node))
    c.replace_nodes([make_node("n1", gpus=2), make_node("n2", gpus=2), copy.deepcopy(node)])
    assert long_name not in c.nodes and sorted(c.nodes) == ["n1", "n2"]
    assert c.rejections.totals == {"Node/field": 1}
