"""No object and no event can stop the watch: per-object failures are logged once, counted and
ignored; informers and background tasks come back after any failure; readiness reports only real
unavailability; start-up works with poison objects in the cluster."""

from __future__ import annotations

import asyncio
import copy
import decimal
import logging

import aiohttp
import orjson
import pytest

import rlsched.extender.cache as cache_module
from rlsched.extender.cache import ClusterCache
from rlsched.extender.kubeapi import ApiError, Informer, backoff_delay
from rlsched.extender.metrics import Metrics
from rlsched.extender.rejections import REASONS, Rejections, classify
from rlsched.extender.server import WATCH_DOWN_NOT_READY_S
from rlsched.extender.settings import ExtenderSettings, GpuConventions, KubeSettings, ServerSettings
from rlsched.extender.testing import FakeKubeApi, Harness, ScriptedWatchApi, make_node, make_pod, start_service

GPU = GpuConventions()
POISON_ERRORS = {
    "overflow": decimal.Overflow,
    "recursion": RecursionError,
    "type": TypeError,
    "memory": MemoryError,
    "key": KeyError,
}


def poison(name: str, **kw) -> dict:
    """A pod of another scheduler in another namespace whose cpu is what the issue's attacker used."""
    p = make_pod(name, namespace="elsewhere", scheduler="nobody", uid=f"uid-{name}", **kw)
    p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1e999999"
    p["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "1e999999"
    return p


@pytest.fixture
def exploding(monkeypatch):
    """pod_info raises the named exception for pods called ``boom-<kind>``: whatever the parser does
    with a given input, every kind of exception must be absorbed."""
    real = cache_module.pod_info

    def pod_info(pod, gpu, where="pod"):
        name = pod.get("metadata", {}).get("name", "") if isinstance(pod, dict) else ""
        if name.startswith("boom-"):
            raise POISON_ERRORS[name[len("boom-") :]]("exploded on purpose")
        return real(pod, gpu, where)

    monkeypatch.setattr(cache_module, "pod_info", pod_info)


def new_cache() -> tuple[ClusterCache, Metrics]:
    metrics = Metrics()
    c = ClusterCache(
        GPU,
        rejections=Rejections(lambda k, r: metrics.objects_rejected.labels(k, r).inc()),
        scheduler_name="rl-scheduler",
    )
    return c, metrics


def rejected(metrics: Metrics, kind: str, reason: str) -> float:
    return (
        metrics.registry.get_sample_value("rlsched_extender_objects_rejected_total", {"kind": kind, "reason": reason})
        or 0.0
    )


# -- the cache --------------------------------------------------------------------------------------


def test_any_exception_on_one_pod_is_absorbed_logged_once_and_counted(exploding, caplog) -> None:
    c, metrics = new_cache()
    c.replace_nodes([make_node("n0", gpus=4)])
    good = make_pod("good", gpus=1, node="n0", uid="good")
    bad = [make_pod(f"boom-{k}", uid=f"boom-{k}", rv="7") for k in POISON_ERRORS]
    with caplog.at_level(logging.WARNING, logger="rlsched.extender.cache"):
        c.replace_pods([*bad, good, poison("p1")])
        c.replace_pods([*bad, good, poison("p1")])  # a relist: same versions, no new lines, no new counts
        for p in bad:
            c.set_pod(p)  # resent events: nothing new either
    assert c.ready and "good" in c.pods and c.state.full_free[0] == 3
    lines = [r for r in caplog.records if getattr(r, "event", "") == "object_rejected"]
    assert sorted(r.object for r in lines if r.object.startswith("default/boom")) == sorted(
        f"default/boom-{k}" for k in POISON_ERRORS
    )
    assert len([r for r in lines if r.object.startswith("default/boom")]) == len(POISON_ERRORS)
    assert rejected(metrics, "Pod", "unexpected") == len(POISON_ERRORS)
    assert all(r.reason in REASONS for r in lines)
    # a new version with the same content (a status update) is neither read, logged nor counted ...
    again = copy.deepcopy(bad[0])
    again["metadata"]["resourceVersion"] = "8"
    again.setdefault("status", {})["conditions"] = [{"type": "PodScheduled", "status": "False"}]
    with caplog.at_level(logging.WARNING, logger="rlsched.extender.cache"):
        c.set_pod(again)
    assert rejected(metrics, "Pod", "unexpected") == len(POISON_ERRORS)
    # ... one whose read parts changed is another unreadable version: logged and counted again
    again["metadata"]["resourceVersion"] = "9"
    again["metadata"]["labels"] = {"changed": "yes"}
    with caplog.at_level(logging.WARNING, logger="rlsched.extender.cache"):
        c.set_pod(again)
    assert rejected(metrics, "Pod", "unexpected") == len(POISON_ERRORS) + 1


def test_log_line_names_kind_object_field_and_reason(caplog) -> None:
    c, metrics = new_cache()
    p = make_pod("weird", uid="weird")
    p["spec"]["containers"][0]["resources"]["requests"]["memory"] = ["16Gi"]
    with caplog.at_level(logging.WARNING, logger="rlsched.extender.cache"):
        c.set_pod(p)
    (line,) = [r for r in caplog.records if getattr(r, "event", "") == "object_rejected"]
    assert line.kind == "Pod" and line.object == "default/weird" and line.uid == "weird"
    assert line.field == "pod.spec.containers[0].resources.requests.memory" and line.reason == "quantity"
    assert "default/weird" in line.getMessage() and "resources.requests.memory" in line.getMessage()
    assert rejected(metrics, "Pod", "quantity") == 1


def test_a_pending_pod_that_becomes_unreadable_leaves_pending(exploding) -> None:
    c, _ = new_cache()
    c.replace_nodes([make_node("n0", gpus=4)])
    ok = make_pod("boom-type", uid="u1")
    ok["metadata"]["name"] = "fine"
    c.set_pod(ok)
    assert "u1" in c.pending and "u1" in c.pod_rules
    bad = copy.deepcopy(ok)
    bad["metadata"]["name"] = "boom-type"
    c.set_pod(bad)
    assert "u1" not in c.pending and "u1" not in c.pod_rules


def test_unreadable_nodes_and_odd_objects_are_ignored() -> None:
    c, metrics = new_cache()
    weird_taints = make_node("tainted", gpus=2)
    weird_taints["spec"]["taints"] = [{"key": "k", "effect": 5}]
    huge = make_node("huge", gpus=2)
    huge["status"]["allocatable"]["cpu"] = "1e999999"
    c.replace_nodes([make_node("n0", gpus=4), weird_taints, huge, "not a node", {"metadata": []}, None])
    assert "n0" in c.nodes and c.node_facts["n0"] is not None
    assert "tainted" in c.nodes and c.node_facts["tainted"] is None  # kept for accounting; bind refuses it
    assert rejected(metrics, "Node", "placement-rules") == 1
    c.replace_pods([None, 7, [], {"metadata": "x"}, {"spec": {}}])
    assert c.ready and not c.pending


def test_classify_has_a_small_fixed_vocabulary() -> None:
    from rlsched.extender.node_rules import RuleError
    from rlsched.extender.objects import ObjectError

    assert classify(ObjectError("pod.spec.containers[0].resources.requests.cpu", "x")) == (
        "quantity",
        "pod.spec.containers[0].resources.requests.cpu",
    )
    assert classify(ObjectError("pod.metadata.name", "x"))[0] == "field"
    assert classify(RuleError("pod.spec.tolerations", "x"))[0] == "placement-rules"
    assert classify(decimal.Overflow())[0] == "unexpected"
    assert classify(RecursionError())[0] == "unexpected"


def test_the_log_once_memory_is_bounded() -> None:
    r = Rejections(size=10)
    for i in range(100):
        r.reject("Pod", {"metadata": {"uid": str(i), "resourceVersion": "1"}}, TypeError("x"))
    assert len(r._seen) == 10 and r.totals == {"Pod/unexpected": 100}


# -- the informer -----------------------------------------------------------------------------------


def node_event(kind, name, rv):
    return {"type": kind, "object": make_node(name, rv=rv)}


async def test_the_informer_survives_anything_one_event_or_callback_throws() -> None:
    applied = []

    def apply(kind, obj):
        name = obj["metadata"]["name"]
        if name == "raise":
            raise decimal.Overflow("from the callback")
        applied.append((kind, name))

    api = ScriptedWatchApi(
        [
            ("list", [make_node("a", rv="1")], "10"),
            (
                "watch",
                [
                    node_event("ADDED", "raise", "11"),
                    "not an event",
                    {"type": "ADDED", "object": [1, 2]},
                    {"type": "ADDED"},
                    node_event("ADDED", "b", "12"),
                ],
            ),
            ("watch", [RuntimeError("the stream broke in a new way")]),  # anything else: relist after a backoff
            ("list", [make_node("c", rv="20")], "20"),
            ("watch", [node_event("MODIFIED", "c", "21")]),
        ]
    )
    sleeps = []

    async def sleep(s):
        sleeps.append(s)

    metrics = Metrics()
    rejections = Rejections(lambda k, r: metrics.objects_rejected.labels(k, r).inc())
    inf = Informer(
        api,
        "nodes",
        "/api/v1/nodes",
        lambda items: applied.append(("replace", len(items))),
        apply,
        KubeSettings(),
        metrics,
        sleep=sleep,
        rejections=rejections,
        jitter=lambda: 0.0,
    )
    with pytest.raises(asyncio.CancelledError):
        await inf.run()
    assert applied == [("replace", 1), ("ADDED", "b"), ("replace", 1), ("MODIFIED", "c")]
    assert api.calls == [("list",), ("watch", "10"), ("watch", "12"), ("list",), ("watch", "20"), ("watch", "21")]
    assert sleeps == [0.5]  # the first retry: base 1 s × jitter factor 0.5
    assert inf.resource_version == "21" and inf.up and inf.last_error is None
    assert inf.resolved["error"].startswith("RuntimeError: the stream broke") and inf.resolved["resolvedAt"]
    assert rejections.totals == {"Node/unexpected": 4}
    assert (
        metrics.registry.get_sample_value(
            "rlsched_extender_watch_restarts_total", {"resource": "nodes", "reason": "unexpected"}
        )
        == 1
    )


async def test_failures_back_off_with_jitter_and_clear_on_recovery() -> None:
    down = ApiError(0, "Unreachable", "connection refused")
    api = ScriptedWatchApi(
        [
            ("list", [], "1"),
            ("watch", [down]),
            ("watch", [down]),
            ("watch", [down]),
            ("watch", [node_event("ADDED", "a", "2")]),
        ]
    )
    sleeps, states = [], []
    inf = None

    async def sleep(s):
        sleeps.append(s)
        states.append((inf.up, inf.last_error, inf.failures))

    inf = Informer(
        api, "nodes", "/x", lambda items: None, lambda k, o: None, KubeSettings(), sleep=sleep, jitter=lambda: 0.5
    )
    with pytest.raises(asyncio.CancelledError):
        await inf.run()
    assert sleeps == [0.75, 1.5, 3.0]  # 1, 2, 4 s × 0.75
    assert states[-1] == (False, "connection refused", 3)
    assert inf.up and inf.last_error is None and inf.failures == 0 and inf.resolved["error"] == "connection refused"
    status = inf.status()
    assert status["lastError"] is None and status["resolved"]["error"] == "connection refused" and status["up"]


def test_backoff_is_capped_and_jittered() -> None:
    assert backoff_delay(1.0, 1, 0.0) == 0.5 and backoff_delay(1.0, 1, 0.999) < 1.0
    assert backoff_delay(1.0, 100, 1.0) == 30.0 and backoff_delay(1.0, 100, 0.0) == 15.0


# -- the service: start-up, supervision, readiness --------------------------------------------------


def settings() -> ExtenderSettings:
    return ExtenderSettings(server=ServerSettings(port=0, status_port=0, status_host="127.0.0.1"))


async def start(api: FakeKubeApi):
    return await start_service(api, settings())


async def eventually(fn, timeout=3.0):
    for _ in range(int(timeout / 0.01)):
        if fn():
            return
        await asyncio.sleep(0.01)
    assert fn()


async def test_startup_and_scheduling_go_on_with_poison_pods(exploding) -> None:
    nodes = [make_node("g0", gpus=4)]
    api = FakeKubeApi(nodes, [poison("before"), make_pod("boom-overflow", uid="boom-overflow", scheduler="nobody")])
    service, stop, task = await start(api)
    try:
        host, port = service.addresses["verbs"]
        shost, sport = service.addresses["status"]
        async with aiohttp.ClientSession() as http:
            assert (await http.get(f"http://{shost}:{sport}/readyz")).status == 200
            # mid-stream poison: new objects of every kind of failure
            for kind in POISON_ERRORS:
                api.emit({"type": "ADDED", "object": make_pod(f"boom-{kind}", uid=f"mid-{kind}", rv="9")})
            api.emit({"type": "ADDED", "object": poison("during")})
            ours = make_pod("ours", gpus=2, uid="ours")
            api.pods[("default", "ours")] = copy.deepcopy(ours)
            api.emit({"type": "ADDED", "object": ours})
            await eventually(lambda: "ours" in service.cache.pending)
            r = await http.post(f"http://{host}:{port}/filter", data=orjson.dumps({"Pod": ours, "NodeNames": ["g0"]}))
            assert (await r.json())["NodeNames"] == ["g0"]
            r = await http.post(
                f"http://{host}:{port}/bind",
                data=orjson.dumps({"PodName": "ours", "PodNamespace": "default", "PodUID": "ours", "Node": "g0"}),
            )
            assert await r.json() == {"Error": ""}
            await eventually(
                lambda: service.cache.pods.get("ours") is not None and service.cache.pods["ours"].status == "bound"
            )
            assert (await http.get(f"http://{shost}:{sport}/readyz")).status == 200
            assert (await http.get(f"http://{shost}:{sport}/healthz")).status == 200
            assert all(not t.done() for t in service.tasks.values())
            text = await (await http.get(f"http://{shost}:{sport}/metrics")).text()
            assert 'rlsched_extender_objects_rejected_total{kind="Pod",reason="unexpected"} ' in text
            assert service.cache.rejections.totals["Pod/unexpected"] == 1 + len(POISON_ERRORS)
    finally:
        stop.set()
        assert await task == 0


async def test_a_watch_task_that_ends_is_restarted() -> None:
    h = Harness([make_node("g0")])
    from rlsched.extender.server import Service

    service = Service(h.settings, h.api, h.engine, h.metrics)
    runs = []
    forever = asyncio.Event()

    async def flaky():
        runs.append(1)
        if len(runs) == 1:
            raise RecursionError("boom")
        if len(runs) == 2:
            return  # ended without an error
        await forever.wait()

    task = asyncio.create_task(service._supervise("watch-pods", flaky, base_s=0.001))
    await eventually(lambda: len(runs) == 3)
    assert not task.done()
    assert (
        h.metrics.registry.get_sample_value(
            "rlsched_extender_watch_restarts_total", {"resource": "pods", "reason": "task-ended"}
        )
        == 2
    )
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_readiness_reports_only_a_watch_down_for_long() -> None:
    h = Harness([make_node("g0")])
    from rlsched.extender.server import Service

    service = Service(h.settings, h.api, h.engine, h.metrics)
    now = [1000.0]
    for inf in service.informers:
        inf.clock = lambda: now[0]
        inf.down_since = None
        inf.up = True
    assert service._watches_down() is None  # before the first list the cache check speaks, not this one
    service.cache.replace_nodes([])
    service.cache.replace_pods([])
    pods = service.informers[1]
    pods.up, pods.down_since, pods.last_error = False, now[0], "connection refused"
    now[0] += WATCH_DOWN_NOT_READY_S - 1
    assert service._watches_down() is None  # a short outage does not flap readiness
    now[0] += 2
    problem = service._watches_down()
    assert problem is not None and "pods" in problem and "connection refused" in problem
    pods._opened()
    assert service._watches_down() is None and pods.resolved["error"] == "connection refused"


async def test_filter_answers_an_unreadable_pod_of_ours_unschedulable() -> None:
    h = Harness([make_node("g0", gpus=4), make_node("g1")])
    p = make_pod("odd", uid="odd")
    p["spec"]["containers"][0]["resources"]["requests"]["memory"] = {"value": "16Gi"}
    body = await h.extender.filter(
        __import__("rlsched.extender.wire", fromlist=["extender_args"]).extender_args(
            {"Pod": p, "NodeNames": ["g0", "g1"]}
        )
    )
    assert body["NodeNames"] == [] and set(body["FailedAndUnresolvableNodes"]) == {"g0", "g1"}
    why = body["FailedAndUnresolvableNodes"]["g0"]
    assert "cannot be scheduled by rl-scheduler" in why and "resources.requests.memory" in why


async def test_filter_of_a_huge_request_is_an_answer_not_an_error() -> None:
    from rlsched.extender.wire import extender_args

    h = Harness([make_node("g0", gpus=4)])
    p = make_pod("huge", uid="huge")
    p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1e999999"
    body = await h.extender.filter(extender_args({"Pod": p, "NodeNames": ["g0"]}))
    assert body["NodeNames"] == [] and body["Error"] == ""
    assert ("g0" in body["FailedAndUnresolvableNodes"]) or ("g0" in body["FailedNodes"])
