"""An unreadable object sent again unchanged — a node's heartbeat, a pod's status update: a new
resourceVersion, nothing the cache reads changed — is neither parsed, logged nor counted again. Once
per resourceVersion, one unreadable node gave a WARNING line and a full parse per heartbeat, forever.
What changed content does is still logged and counted; the memory of rejected versions is bounded."""

from __future__ import annotations

import copy
import logging

import pytest

import rlsched.extender.cache as cache_module
from rlsched.extender.cache import ClusterCache
from rlsched.extender.metrics import Metrics
from rlsched.extender.rejections import Rejections
from rlsched.extender.settings import GpuConventions
from rlsched.extender.testing import make_node, make_pod

GPU = GpuConventions()


def new_cache() -> tuple[ClusterCache, Metrics]:
    metrics = Metrics()
    c = ClusterCache(
        GPU,
        rejections=Rejections(lambda k, r: metrics.objects_rejected.labels(k, r).inc()),
        scheduler_name="rl-scheduler",
    )
    c.replace_nodes([make_node("g0", gpus=4)])
    c.replace_pods([])
    return c, metrics


def counted(metrics: Metrics, kind: str, reason: str) -> float:
    sample = metrics.registry.get_sample_value(
        "rlsched_extender_objects_rejected_total", {"kind": kind, "reason": reason}
    )
    return sample or 0.0


def warnings(caplog) -> int:
    return sum(1 for r in caplog.records if getattr(r, "event", "") == "object_rejected")


def heartbeat(obj: dict, i: int) -> dict:
    """``obj`` again as a later event that changes nothing read: a resourceVersion and a condition."""
    out = copy.deepcopy(obj)
    out["metadata"]["resourceVersion"] = str(5000 + i)
    out.setdefault("status", {})["conditions"] = [{"type": "Ready", "lastHeartbeatTime": f"t{i}"}]
    return out


def parses(monkeypatch, name: str) -> list[int]:
    """Count the calls of the cache's reader ``name`` (node_spec, pod_info, ...)."""
    calls: list[int] = []
    real = getattr(cache_module, name)

    def counting(*args, **kw):
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(cache_module, name, counting)
    return calls


def test_heartbeats_of_an_unreadable_node_are_not_parsed_logged_or_counted_again(monkeypatch, caplog) -> None:
    c, metrics = new_cache()
    calls = parses(monkeypatch, "node_spec")
    big = make_node("ts0", gpus=300)  # more cards than the extender supports
    with caplog.at_level(logging.WARNING, logger="rlsched.extender.cache"):
        for i in range(100):
            c.set_node(heartbeat(big, i))
        c.replace_nodes([make_node("g0", gpus=4), heartbeat(big, 100)])  # a relist: the same content
    assert warnings(caplog) == 1 and len(calls) == 1
    assert counted(metrics, "Node", "quantity") == 1 and c.stats.node_errors == 1
    assert "300 cards" in c.rejected_nodes["ts0"] and "ts0" not in c.nodes
    # A changed content is another unreadable version: read, logged and counted.
    priced = heartbeat(big, 101)
    priced["metadata"]["annotations"] = {GPU.node_price_annotation: "not-a-price"}
    with caplog.at_level(logging.WARNING, logger="rlsched.extender.cache"):
        c.set_node(priced)
        c.set_node(heartbeat(priced, 102))
    assert warnings(caplog) == 2 and len(calls) == 2 and c.stats.node_errors == 2
    assert sum(c.rejections.totals.values()) == 2
    # Readable at last: used; the unreadable content coming back is read (and logged) afresh.
    c.set_node(heartbeat(make_node("ts0", gpus=8), 103))
    assert "ts0" in c.nodes and "ts0" not in c.rejected_nodes
    with caplog.at_level(logging.WARNING, logger="rlsched.extender.cache"):
        c.set_node(heartbeat(big, 104))
    assert warnings(caplog) == 3 and c.nodes["ts0"].gpu_count == 8 and "ts0" in c.rejected_nodes


def test_a_deleted_or_unlisted_node_forgets_its_rejected_version() -> None:
    c, metrics = new_cache()
    big = make_node("ts0", gpus=300)
    c.set_node(heartbeat(big, 0))
    c.delete_node("ts0")
    c.set_node(heartbeat(big, 1))  # recreated as unreadable as before: reported again
    assert counted(metrics, "Node", "quantity") == 2 and "ts0" in c.rejected_nodes
    c.replace_nodes([make_node("g0", gpus=4)])
    c.set_node(heartbeat(big, 2))
    assert counted(metrics, "Node", "quantity") == 3


def test_heartbeats_of_a_node_whose_taints_cannot_be_read_are_not_logged_again(caplog) -> None:
    c, metrics = new_cache()
    node = make_node("t0", gpus=2)
    node["spec"] = {"taints": "not-a-list"}
    with caplog.at_level(logging.WARNING, logger="rlsched.extender.cache"):
        for i in range(20):
            c.set_node(heartbeat(node, i))
    assert "t0" in c.nodes and c.node_facts["t0"] is None  # kept; bind refuses it
    assert warnings(caplog) == 1 and counted(metrics, "Node", "placement-rules") == 1


def unreadable_pod(**kw) -> dict:
    pod = make_pod("bad", uid="u-bad", **kw)
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    return pod


def test_status_updates_of_an_unreadable_pod_are_not_parsed_logged_or_counted_again(monkeypatch, caplog) -> None:
    c, metrics = new_cache()
    calls = parses(monkeypatch, "pod_info")
    bad = unreadable_pod()
    with caplog.at_level(logging.WARNING, logger="rlsched.extender.cache"):
        for i in range(50):
            c.set_pod(heartbeat(bad, i))
        c.replace_pods([heartbeat(bad, 50)])
    assert warnings(caplog) == 1 and len(calls) == 1
    assert counted(metrics, "Pod", "quantity") == 1 and c.stats.pod_errors == 1 and "u-bad" not in c.pending
    readable = make_pod("bad", uid="u-bad", rv="6000")
    c.set_pod(readable)
    assert "u-bad" in c.pending
    with caplog.at_level(logging.WARNING, logger="rlsched.extender.cache"):
        c.set_pod(heartbeat(bad, 51))  # unreadable again after a readable version: reported again
    assert warnings(caplog) == 2 and "u-bad" not in c.pending


def test_a_running_pod_whose_request_cannot_be_counted_is_reported_once_per_content(caplog) -> None:
    c, metrics = new_cache()
    odd = make_pod("odd", uid="u-odd", node="g0", gpus=1, gpu_milli=300)  # bound by another scheduler
    odd["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"  # and not even its cpu reads
    with caplog.at_level(logging.WARNING, logger="rlsched.extender.cache"):
        for i in range(10):
            c.set_pod(heartbeat(odd, i))
    assert "u-odd" not in c.pods and warnings(caplog) == 1


def test_a_pending_pod_whose_rules_cannot_be_read_is_reported_once_per_content(caplog) -> None:
    c, metrics = new_cache()
    pod = make_pod("r", uid="u-r")
    pod["spec"]["tolerations"] = "not-a-list"
    with caplog.at_level(logging.WARNING, logger="rlsched.extender.cache"):
        for i in range(10):
            c.set_pod(heartbeat(pod, i))
    assert "u-r" in c.pending and "u-r" in c.rules_problems and "u-r" not in c.pod_rules
    assert c.pending["u-r"].resource_version == "5009"  # the status updates still refresh the version
    assert warnings(caplog) == 1 and counted(metrics, "Pod", "placement-rules") == 1


def test_a_deleted_or_unlisted_pod_forgets_its_rejected_version() -> None:
    c, metrics = new_cache()
    bad = unreadable_pod()
    c.set_pod(heartbeat(bad, 0))
    c.delete_pod("u-bad")
    c.set_pod(heartbeat(bad, 1))
    assert counted(metrics, "Pod", "quantity") == 2
    c.replace_pods([])
    c.set_pod(heartbeat(bad, 2))
    assert counted(metrics, "Pod", "quantity") == 3


@pytest.mark.parametrize("kind", ["node", "pod"])
def test_the_rejected_versions_are_bounded(monkeypatch, kind) -> None:
    monkeypatch.setattr(cache_module, "MAX_REJECTED_NODES", 3)
    monkeypatch.setattr(cache_module, "MAX_REJECTED_PODS", 3)
    c, metrics = new_cache()
    for i in range(5):
        if kind == "node":
            c.set_node(make_node(f"ts{i}", gpus=300))
        else:
            c.set_pod(make_pod(f"p{i}", uid=f"u{i}", cpu="lots"))
    if kind == "node":
        assert list(c._rejected_node_digests) == ["ts2", "ts3", "ts4"] == list(c.rejected_nodes)
        c.set_node(heartbeat(make_node("ts0", gpus=300), 1))  # forgotten: read and counted again
        assert counted(metrics, "Node", "quantity") == 6
    else:
        assert list(c._rejected_pods) == ["u2", "u3", "u4"]
        c.set_pod(heartbeat(make_pod("p0", uid="u0", cpu="lots"), 1))
        assert counted(metrics, "Pod", "quantity") == 6
