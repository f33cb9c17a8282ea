"""Objects the watch delivered but could not use are reported as what they are: a node the extender
rejected is answered as rejected, with its reason (not "the watch lags"); a bound pod whose GPU
request makes no sense is logged once per version and counted in ``objects_rejected_total``."""

from __future__ import annotations

import copy
import logging

import rlsched.extender.cache as cache_module
from rlsched.extender.testing import Harness, make_node, make_pod
from rlsched.extender.verbs import UNKNOWN_NODE
from rlsched.extender.wire import extender_args

NODES = [make_node("g0", gpus=4), make_node("c0")]
REJECTED_NODE = "node rejected by the extender: "


def time_sliced(name: str = "ts0", gpus: int = 320, rv: str = "1000") -> dict:
    """A node advertising more cards than the extender supports (NVIDIA time-slicing replicas)."""
    return make_node(name, gpus=gpus, rv=rv)


async def test_a_rejected_node_is_answered_unresolvable_with_its_reason() -> None:
    h = Harness(copy.deepcopy(NODES) + [time_sliced()])
    assert "ts0" not in h.cache.nodes and "320 cards" in h.cache.rejected_nodes["ts0"]
    body = await h.extender.filter(extender_args({"Pod": make_pod("p", uid="p"), "NodeNames": ["ts0", "c0", "ghost"]}))
    assert body["NodeNames"] == ["c0"]
    why = body["FailedAndUnresolvableNodes"]["ts0"]
    assert why.startswith(REJECTED_NODE) and "320 cards" in why and "at most 256" in why and len(why) <= 256
    assert body["FailedNodes"] == {"ghost": UNKNOWN_NODE}  # a node never seen is still the watch lagging


async def test_a_rejected_node_is_named_so_with_no_other_node_known() -> None:
    h = Harness([time_sliced()])
    body = await h.extender.filter(extender_args({"Pod": make_pod("p", uid="p"), "NodeNames": ["ts0", "ghost"]}))
    assert body["FailedAndUnresolvableNodes"]["ts0"].startswith(REJECTED_NODE)
    assert "has not seen any node yet" in body["FailedNodes"]["ghost"]


async def test_bind_refuses_a_rejected_node_with_its_reason() -> None:
    h = Harness(copy.deepcopy(NODES) + [time_sliced()])
    pod = h.add_pod(make_pod("p", uid="p"))
    h.cache.set_pod(pod)
    result = await h.binder.bind("p", "default", "p", "ts0")
    assert result.result == "refused" and "rejected by the extender" in result.error and "320 cards" in result.error
    result = await h.binder.bind("p", "default", "p", "ghost")
    assert result.result == "error" and "not yet seen by the watch" in result.error


def test_a_rejected_node_is_forgotten_when_it_reads_is_deleted_or_not_listed() -> None:
    h = Harness(copy.deepcopy(NODES) + [time_sliced()])
    h.cache.set_node(time_sliced(gpus=8, rv="1001"))  # fixed: a later version reads
    assert "ts0" in h.cache.nodes and "ts0" not in h.cache.rejected_nodes
    h.cache.set_node(time_sliced(rv="1002"))  # broken again: the last good version stays in use
    assert "ts0" in h.cache.nodes and "ts0" in h.cache.rejected_nodes
    h.cache.set_node(time_sliced(gpus=8, rv="1001"))  # back to the last good version (its digest)
    assert "ts0" not in h.cache.rejected_nodes
    h.cache.delete_node("ts0")
    assert "ts0" not in h.cache.rejected_nodes
    h.cache.set_node(time_sliced(rv="1003"))
    h.cache.replace_nodes(copy.deepcopy(NODES))  # a relist without it
    assert "ts0" not in h.cache.rejected_nodes


def test_the_rejected_nodes_are_bounded(monkeypatch) -> None:
    monkeypatch.setattr(cache_module, "MAX_REJECTED_NODES", 3)
    h = Harness(copy.deepcopy(NODES))
    for i in range(5):
        h.cache.set_node(time_sliced(f"ts{i}"))
    assert list(h.cache.rejected_nodes) == ["ts2", "ts3", "ts4"]


def gpu_request_rejections(h: Harness) -> float:
    sample = h.metrics.registry.get_sample_value(
        "rlsched_extender_objects_rejected_total", {"kind": "Pod", "reason": "gpu-request"}
    )
    return sample or 0.0


def test_a_bound_pod_with_an_inconsistent_gpu_request_is_counted_once_per_version(caplog) -> None:
    caplog.set_level(logging.INFO)
    h = Harness([make_node("g0", gpus=4)])
    odd = make_pod("odd", uid="odd", node="g0", gpus=1, gpu_milli=300)  # bound by another scheduler
    h.cache.set_pod(odd)
    h.cache.set_pod(copy.deepcopy(odd))  # the same version again (a resent event)
    h.cache.replace_pods([copy.deepcopy(odd)])  # a relist
    assert gpu_request_rejections(h) == 1 and h.cache.summary()["rejectedObjects"] == {"Pod/gpu-request": 1}
    lines = [r for r in caplog.records if getattr(r, "event", None) == "object_rejected"]
    assert (
        len(lines) == 1
        and "counted as 2 whole card(s)" in lines[0].getMessage()
        and "not both" in lines[0].getMessage()
    )
    assert lines[0].reason == "gpu-request"
    newer = copy.deepcopy(odd)
    newer["metadata"]["resourceVersion"] = "2001"
    newer["metadata"]["labels"] = {"changed": "yes"}
    h.cache.set_pod(newer)
    assert gpu_request_rejections(h) == 2
