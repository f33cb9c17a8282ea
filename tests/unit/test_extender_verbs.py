"""The four verbs over HTTP with payloads shaped exactly as kube-scheduler v1.37 sends them."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from rlsched.extender.cache import ASSUMED, BOUND, UNCERTAIN
from rlsched.extender.kubeapi import ApiError
from rlsched.extender.policy import Outcome, Verdict
from rlsched.extender.settings import ExtenderSettings, PolicySettings
from rlsched.extender.testing import Harness, make_node, make_pod
from rlsched.extender.verbs import extender_scores
from rlsched.extender.wire import BindingArgs, ExtenderArgs
from rlsched.policy.decision import Decision
from rlsched.policy.scorers import NodeScores, Scorer

NODES = [make_node(f"v100-{i}", gpus=4, model="V100M16") for i in range(6)] + [
    make_node("t4-0", gpus=2, model="T4"),
    make_node("cpu-0"),
    make_node("cpu-1", cpu="2", memory="4Gi"),
]
NAMES = [n["metadata"]["name"] for n in NODES]


SEEN: list[tuple[bool, dict[str, int]]] = []
"""What FakeModel.score was given on a real cluster: whether the pod is latency-sensitive, and the
latency-sensitive pods on each candidate node."""


class FakeModel(Scorer):
    """A stand-in for the exported PPO policy: prefers one node, or misbehaves on request."""

    name = "ppo"

    def __init__(self, spec: dict):
        self.spec = spec
        self.version = spec.get("version", "v1")
        self.digest = "d" * 64

    def score(self, state, req, nodes):
        real = "v100-0" in state.index or self.spec.get("always")  # misbehave on real clusters, not in warm-up
        if self.spec.get("sleep") and real:
            time.sleep(self.spec["sleep"])
        if self.spec.get("fail") and real:
            raise RuntimeError("the model exploded")
        if real:
            SEEN.append((req.latency_sensitive, {state.names[n]: int(state.ls_pods[n]) for n in nodes}))
        values = np.array([1.0 if state.names[n] == self.spec.get("prefer") else 0.0 for n in nodes])
        if self.spec.get("nan") and real:
            values[:] = np.nan
        return NodeScores(values)

    def verdict(self, state, req, nodes, scores):
        v = self.spec.get("verdict")
        hold = float(self.spec.get("hold", 60))
        return None if v is None else Verdict(v, "cluster too fragmented", hold)


def fake_loader(path, typical):
    return FakeModel(json.loads(Path(path).read_text()))


def model_file(tmp_path, **spec) -> str:
    p = tmp_path / "model.json"
    p.write_text(json.dumps(spec))
    return str(p)


def harness(pods=(), nodes=NODES, **policy) -> Harness:
    s = ExtenderSettings(policy=PolicySettings(**policy))
    return Harness(copy.deepcopy(nodes), list(pods), s, model_loader=fake_loader)


async def call(client, verb, body):
    r = await client.post(f"/{verb}", data=orjson.dumps(body), headers={"Content-Type": "application/json"})
    return r.status, orjson.loads(await r.read())


def served(h: Harness) -> dict:
    return h.ring.read(0)["records"][-1]


# -- filter ----------------------------------------------------------------------------------------


async def test_filter_cache_capable_top_choice_without_reasons() -> None:
    """With a node kept, kube-scheduler never reads FailedNodes: none are sent (it decoded ~22 KB of
    them per pod at 1,000 nodes)."""
    full = make_pod("full", gpus=4, node="v100-5", uid="full")
    h = harness([full])
    pod = make_pod("p", gpu_milli=500, gpu_models="V100M16")
    async with TestClient(TestServer(h.app())) as c:
        status, body = await call(c, "filter", {"Pod": pod, "NodeNames": NAMES, "Nodes": None})
    assert status == 200 and body["Error"] == "" and body["Nodes"] is None
    assert len(body["NodeNames"]) == 1 and body["NodeNames"][0].startswith("v100-")
    assert body["NodeNames"][0] == served(h)["node"]
    assert body["FailedNodes"] == {} and body["FailedAndUnresolvableNodes"] == {}
    assert served(h)["servedBy"] == "fallback" and served(h)["fallbackReason"] == "no-model"


async def test_filter_reasons_when_nothing_fits() -> None:
    """An unschedulable pod gets a reason per node: resolvable (preemption may help) or not."""
    h = harness([make_pod(f"full-{i}", gpus=4, node=f"v100-{i}", uid=f"full-{i}") for i in range(6)])
    pod = make_pod("p", gpu_milli=500, gpu_models="V100M16")
    async with TestClient(TestServer(h.app())) as c:
        status, body = await call(c, "filter", {"Pod": pod, "NodeNames": NAMES, "Nodes": None})
    assert status == 200 and body["Error"] == "" and body["NodeNames"] == []
    assert body["FailedNodes"] == {f"v100-{i}": "no GPU card with 500 milli free" for i in range(6)}
    assert body["FailedAndUnresolvableNodes"] == {
        "t4-0": "GPU model T4 not allowed (pod allows V100M16)",
        "cpu-0": "node has no GPU",
        "cpu-1": "insufficient cpu (pod requests 4000m); insufficient memory (pod requests 16384Mi); node has no GPU",
    }
    assert served(h)["node"] is None and h.extender.counts == {"unschedulable": 1}


async def test_filter_full_node_mode_echoes_the_kept_nodes() -> None:
    h = harness()
    pod = make_pod("p", gpus=2)
    async with TestClient(TestServer(h.app())) as c:
        status, body = await call(
            c, "filter", {"Pod": pod, "Nodes": {"metadata": {}, "items": NODES}, "NodeNames": None}
        )
    assert status == 200 and body["NodeNames"] is None
    kept = body["Nodes"]["items"]
    assert len(kept) == 1 and kept[0] == NODES[NAMES.index(kept[0]["metadata"]["name"])]
    assert body["FailedAndUnresolvableNodes"] == {} and body["FailedNodes"] == {}


async def test_filter_reads_the_watched_version_of_the_pod_once() -> None:
    """Same UID and resourceVersion as the watch's copy: the watch's reading serves (a version's
    content never changes); another version is read from the request."""
    watched = make_pod("p", gpus=1, uid="p", rv="7")
    h = harness([watched])
    sent = copy.deepcopy(watched)
    sent["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "4"  # not what version 7 says
    async with TestClient(TestServer(h.app())) as c:
        _, body = await call(c, "filter", {"Pod": sent, "NodeNames": NAMES})
        assert served(h)["features"]["pod"]["numGpu"] == 1 and h.extender.memory.get("p").info is h.cache.pending["p"]
        sent["metadata"]["resourceVersion"] = "8"  # newer than the watch: read from the request
        _, body = await call(c, "filter", {"Pod": sent, "NodeNames": NAMES})
        assert served(h)["features"]["pod"]["numGpu"] == 4


async def test_filter_record_is_built_when_read_with_what_the_decision_saw() -> None:
    pod = make_pod("p", gpus=4, uid="p")
    h = harness([pod])
    async with TestClient(TestServer(h.app())) as c:
        _, body = await call(c, "filter", {"Pod": pod, "NodeNames": NAMES})
        node = body["NodeNames"][0]
        h.cache.add("other", "default/other", node, h.cache.pending["p"].spec, (0, 1, 2, 3), BOUND)  # fills it
        record = served(h)
    assert record["node"] == node and record["features"]["node"]["fullFreeCards"] == 4
    assert record["seq"] == 1 and served(h) is record  # built once


@pytest.mark.parametrize("top_k, expected", [(0, 7), (3, 3), (1, 1)])
async def test_top_k(top_k, expected) -> None:
    h = harness(top_k=top_k)
    async with TestClient(TestServer(h.app())) as c:
        _, body = await call(c, "filter", {"Pod": make_pod("p", gpus=1), "NodeNames": NAMES})
    assert len(body["NodeNames"]) == expected
    assert body["NodeNames"][0] == served(h)["node"]


async def test_unknown_nodes_fail_resolvably_in_both_modes() -> None:
    h = harness(nodes=NODES[:2])
    pod = make_pod("p", gpus=1)
    async with TestClient(TestServer(h.app())) as c:
        _, body = await call(c, "filter", {"Pod": pod, "NodeNames": ["v100-0", "ghost"]})
        assert "watch lags" in body["FailedNodes"]["ghost"] and body["NodeNames"] == ["v100-0"]
        _, body = await call(c, "filter", {"Pod": pod, "Nodes": {"items": [NODES[2], NODES[1]]}})
        assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["v100-1"]
        assert "watch lags" in body["FailedNodes"]["v100-2"]
    assert "v100-2" not in h.cache.nodes  # the request never feeds the cache: the watch does


async def test_invalid_gpu_request_is_unresolvable_everywhere() -> None:
    h = harness()
    async with TestClient(TestServer(h.app())) as c:
        status, body = await call(c, "filter", {"Pod": make_pod("p", gpus=2, gpu_milli=300), "NodeNames": NAMES})
    assert status == 200 and body["NodeNames"] == [] and set(body["FailedAndUnresolvableNodes"]) == set(NAMES)
    assert "not both" in body["FailedAndUnresolvableNodes"]["v100-0"]


async def test_no_fit_anywhere() -> None:
    h = harness()
    async with TestClient(TestServer(h.app())) as c:
        _, body = await call(c, "filter", {"Pod": make_pod("p", gpus=8), "NodeNames": NAMES})
    assert body["NodeNames"] == [] and set(body["FailedAndUnresolvableNodes"]) == set(NAMES)
    assert h.extender.counts == {"unschedulable": 1}


# -- prioritize --------------------------------------------------------------------------------------


async def test_prioritize_reuses_filter_and_keeps_the_choice_on_top() -> None:
    h = harness(top_k=0)
    pod = make_pod("p", gpu_milli=200)
    async with TestClient(TestServer(h.app())) as c:
        _, f = await call(c, "filter", {"Pod": pod, "NodeNames": NAMES})
        decisions = h.engine.counters["decisions"]
        status, scores = await call(c, "prioritize", {"Pod": pod, "NodeNames": f["NodeNames"]})
    assert status == 200 and h.engine.counters["decisions"] == decisions  # filter's work reused
    assert [s["Host"] for s in scores] == f["NodeNames"]
    assert all(0 <= s["Score"] <= 10 and isinstance(s["Score"], int) for s in scores)
    top = [s["Host"] for s in scores if s["Score"] == 10]
    assert top == [served(h)["node"]]


async def test_prioritize_without_filter_and_with_a_subset() -> None:
    h = harness()
    pod = make_pod("p", gpus=1)
    async with TestClient(TestServer(h.app())) as c:
        _, scores = await call(c, "prioritize", {"Pod": pod, "NodeNames": ["v100-1", "v100-2", "cpu-0", "ghost"]})
    by = {s["Host"]: s["Score"] for s in scores}
    assert by["cpu-0"] == 0 and by["ghost"] == 0 and sorted([by["v100-1"], by["v100-2"]])[1] == 10


@pytest.mark.parametrize("values", [[3.0, -1e9, 1e300, 0.5], [7, 7, 7, 7], [0.1, 0.2, 0.3, 0.4]])
def test_extender_scores_are_clamped_with_a_unique_top(values) -> None:
    feasible = np.array([0, 2, 3, 5])
    outcome = Outcome(Decision(3, (), feasible, NodeScores(np.array(values))), "policy", "ppo")
    idx = np.array([5, 0, 2, 3, -1, 4])
    scores = extender_scores(outcome, idx, np.arange(6))
    assert scores.min() >= 0 and scores.max() == 10 and scores.tolist().count(10) == 1
    assert scores[3] == 10 and scores[4] == 0 and scores[5] == 0


# -- bind ------------------------------------------------------------------------------------------


async def test_bind_records_cards_on_the_binding_in_one_write() -> None:
    h = harness()
    pod = h.add_pod(make_pod("p", gpu_milli=300))
    h.cache.set_pod(pod)  # the watch delivered it: bind reads it from the cache, no GET
    uid = pod["metadata"]["uid"]
    async with TestClient(TestServer(h.app())) as c:
        _, f = await call(c, "filter", {"Pod": pod, "NodeNames": NAMES})
        node = f["NodeNames"][0]
        status, body = await call(c, "bind", {"PodName": "p", "PodNamespace": "default", "PodUID": uid, "Node": node})
    assert status == 200 and body == {"Error": ""}
    cards = served(h)["cards"]
    assert h.api.calls == [  # one API write: the Binding, carrying the assignment
        (
            "bind",
            "default",
            "p",
            node,
            {
                "rlsched.io/gpu-cards": ",".join(map(str, cards)),
                "rlsched.io/gpu-card-milli": "300",
                "rlsched.io/gpu-node": node,
            },
        ),
    ]
    annotations = h.api.pods[("default", "p")]["metadata"]["annotations"]
    assert annotations["rlsched.io/gpu-cards"] == ",".join(map(str, cards))
    entry = h.cache.pods[uid]
    assert entry.status == ASSUMED and entry.bind_done and entry.cards == tuple(cards)
    assert h.cache.state.card_free[h.cache.state.index[node], cards[0]] == 700
    # the watch then shows the pod bound: confirmed, not counted twice
    h.cache.set_pod(h.api.pods[("default", "p")])
    assert h.cache.pods[uid].status == BOUND and h.cache.state.card_free[h.cache.state.index[node], cards[0]] == 700
    record = served(h)
    assert record["kind"] == "bind" and record["followedPolicy"] is True and record["result"] == "ok"


async def test_bind_is_idempotent_by_uid() -> None:
    h = harness()
    pod = h.add_pod(make_pod("p", gpus=1))
    args = {"PodName": "p", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"], "Node": "v100-3"}
    async with TestClient(TestServer(h.app())) as c:
        assert (await call(c, "bind", args))[1] == {"Error": ""}
        h.cache.set_pod(h.api.pods[("default", "p")])
        calls = len(h.api.calls)
        assert (await call(c, "bind", args))[1] == {"Error": ""}
        assert len(h.api.calls) == calls
        _, body = await call(c, "bind", dict(args, Node="v100-4"))
    assert "already bound to node v100-3" in body["Error"]


async def test_bind_retry_after_lost_answer_succeeds() -> None:
    """The binding was created but kube-scheduler never heard: the retry meets 409 'already assigned'."""
    h = harness()
    pod = h.add_pod(make_pod("p", gpus=1))
    uid = pod["metadata"]["uid"]
    h.api.pods[("default", "p")]["spec"]["nodeName"] = "v100-1"
    h.api.pods[("default", "p")]["status"]["phase"] = "Pending"
    h.cache.pending[uid] = __import__("rlsched.extender.objects", fromlist=["pod_info"]).pod_info(pod, h.settings.gpu)
    res = await h.binder.bind(uid, "default", "p", "v100-1")
    assert res.error == ""


async def test_failed_bind_releases_the_cards() -> None:
    h = harness()
    pod = h.add_pod(make_pod("p", gpus=4))
    h.api.fail["bind"] = ApiError(403, "Forbidden", "pods/binding is forbidden")
    before = h.cache.state.full_free.copy()
    res = await h.binder.bind(pod["metadata"]["uid"], "default", "p", "v100-0")
    assert "forbidden" in res.error and "RBAC" in res.error
    assert pod["metadata"]["uid"] not in h.cache.pods
    assert (h.cache.state.full_free == before).all()


async def test_bind_with_unknown_outcome_keeps_cards_for_a_while() -> None:
    h = harness()
    pod = h.add_pod(make_pod("p", gpus=4))
    h.api.fail["bind"] = 0.01  # stall, then time out
    res = await h.binder.bind(pod["metadata"]["uid"], "default", "p", "v100-0")
    assert res.result == "uncertain" and "reserved" in res.error
    assert h.cache.pods[pod["metadata"]["uid"]].status == UNCERTAIN
    assert h.cache.state.full_free[h.cache.state.index["v100-0"]] == 0


async def test_the_binding_write_is_timed_by_result_and_only_when_made() -> None:
    """rlsched_extender_binding_write_seconds: the POST alone (set beside kube-apiserver's own handler
    latency in docs/benchmarks.md); a refused bind makes no write and records none."""
    h = harness()
    h.api.delay_s = 0.02
    ok, stalled, refused = (h.add_pod(make_pod(n, gpus=1)) for n in ("ok", "stalled", "refused"))
    refused["spec"]["schedulerName"] = "default-scheduler"
    h.api.pods[("default", "refused")] = refused
    async with TestClient(TestServer(h.app())) as c:
        for pod, node in ((ok, "v100-0"), (refused, "v100-2")):
            m = pod["metadata"]
            await call(c, "bind", {"PodName": m["name"], "PodNamespace": "default", "PodUID": m["uid"], "Node": node})
        h.api.fail["bind"] = 0.01  # stalls, then times out: outcome unknown
        m = stalled["metadata"]
        await call(c, "bind", {"PodName": m["name"], "PodNamespace": "default", "PodUID": m["uid"], "Node": "v100-1"})

    def write(result: str, what: str) -> float | None:
        return h.metrics.registry.get_sample_value(f"rlsched_extender_binding_write_seconds_{what}", {"result": result})

    assert write("ok", "count") == 1 and write("ok", "sum") >= 0.02
    assert write("uncertain", "count") == 1 and write("uncertain", "sum") >= 0.03
    assert write("refused", "count") is None
    assert h.metrics.registry.get_sample_value("rlsched_extender_binds_total", {"result": "refused"}) == 1


@pytest.mark.parametrize(
    "node, words", [("ghost", "not in the extender's cache"), ("cpu-0", "no longer fits node cpu-0")]
)
async def test_bind_to_impossible_node(node, words) -> None:
    h = harness()
    pod = h.add_pod(make_pod("p", gpus=1))
    res = await h.binder.bind(pod["metadata"]["uid"], "default", "p", node)
    assert words in res.error and h.api.calls[-1][0] == "get"


async def test_bind_unknown_pod() -> None:
    h = harness()
    res = await h.binder.bind("nope", "default", "missing", "v100-0")
    assert "not found" in res.error


async def test_bind_recreated_pod_is_refused() -> None:
    h = harness()
    h.add_pod(make_pod("p", gpus=1, uid="new-uid"))
    res = await h.binder.bind("old-uid", "default", "p", "v100-0")
    assert "recreated" in res.error


async def test_cpu_only_pod_binds_without_annotation() -> None:
    h = harness()
    pod = h.add_pod(make_pod("p"))
    res = await h.binder.bind(pod["metadata"]["uid"], "default", "p", "cpu-0")
    assert res.error == "" and [c[0] for c in h.api.calls] == ["get", "bind"]


# -- preempt ---------------------------------------------------------------------------------------


async def test_preempt_keeps_nodes_where_victims_free_the_cards() -> None:
    a = make_pod("a", gpus=4, node="v100-0", uid="a")
    b = make_pod("b", cpu="1", node="v100-1", uid="b")
    c_ = make_pod("c", gpus=4, node="v100-1", uid="c")
    h = harness([a, b, c_])
    pod = h.add_pod(make_pod("p", gpus=2))  # preempt reads the preemptor from the API, not the request
    meta = {
        "v100-0": {"Pods": [{"UID": "a"}], "NumPDBViolations": 1},
        "v100-1": {"Pods": [{"UID": "b"}], "NumPDBViolations": 0},  # frees cpu only: cards stay taken
        "ghost": {"Pods": [{"UID": "x"}], "NumPDBViolations": 0},
    }
    async with TestClient(TestServer(h.app())) as c:
        status, body = await call(c, "preempt", {"Pod": pod, "NodeNameToMetaVictims": meta, "NodeNameToVictims": None})
        assert status == 200 and body == {
            "NodeNameToMetaVictims": {"v100-0": {"Pods": [{"UID": "a"}], "NumPDBViolations": 1}}
        }
        full = {"v100-0": {"Pods": [a], "NumPDBViolations": 0}}
        status, body = await call(c, "preempt", {"Pod": pod, "NodeNameToVictims": full})
        assert body == {"NodeNameToMetaVictims": {"v100-0": {"Pods": [{"UID": "a"}], "NumPDBViolations": 0}}}
    assert h.cache.state.full_free[h.cache.state.index["v100-0"]] == 0  # the trial never touched the real state


# -- the policy ------------------------------------------------------------------------------------


async def test_learned_policy_serves(tmp_path) -> None:
    h = harness(model_path=model_file(tmp_path, prefer="v100-4", version="m7"))
    async with TestClient(TestServer(h.app())) as c:
        _, body = await call(c, "filter", {"Pod": make_pod("p", gpus=1), "NodeNames": NAMES})
    assert body["NodeNames"] == ["v100-4"]
    rec = served(h)
    assert (rec["servedBy"], rec["scorer"], rec["modelVersion"], rec["fallbackReason"]) == ("policy", "ppo", "m7", None)
    assert rec["topScores"][0] == {"node": "v100-4", "score": 1.0} and rec["features"]["pod"]["numGpu"] == 1


async def test_the_policy_sees_latency_sensitive_pods_by_their_labels(tmp_path) -> None:
    """What a model trained with the QoS features reads: the pod's class (Koordinator's label here) and
    the latency-sensitive pods bound on each node (the rlsched label, and a Guaranteed pod's class)."""
    ls = make_pod("ls", gpus=1, node="v100-1", uid="ls")
    ls["metadata"]["labels"] = {"rlsched.io/latency-sensitive": "true"}
    guaranteed = make_pod("g", gpus=1, node="v100-2", uid="g")
    guaranteed["status"]["qosClass"] = "Guaranteed"
    be = make_pod("be", gpus=1, node="v100-3", uid="be")
    be["metadata"]["labels"] = {"koordinator.sh/qosClass": "BE"}
    h = harness([ls, guaranteed, be], model_path=model_file(tmp_path, prefer="v100-4"))
    pod = make_pod("p", gpus=1)
    pod["metadata"]["labels"] = {"koordinator.sh/qosClass": "LSR"}
    pod["status"].pop("qosClass", None)
    SEEN.clear()
    async with TestClient(TestServer(h.app())) as c:
        await call(c, "filter", {"Pod": pod, "NodeNames": NAMES})
    sensitive, counts = SEEN[-1]
    assert sensitive and counts["v100-1"] == counts["v100-2"] == 1 and counts["v100-3"] == counts["v100-0"] == 0


@pytest.mark.parametrize(
    "spec, reason", [({"fail": True}, "error"), ({"nan": True}, "bad-output"), ({"sleep": 0.2}, "deadline")]
)
async def test_policy_failures_fall_back(tmp_path, spec, reason) -> None:
    h = harness(model_path=model_file(tmp_path, prefer="v100-4", **spec), deadline_ms=20)
    async with TestClient(TestServer(h.app())) as c:
        start = time.perf_counter()
        status, body = await call(c, "filter", {"Pod": make_pod("p", gpus=1), "NodeNames": NAMES})
        assert status == 200 and len(body["NodeNames"]) == 1 and time.perf_counter() - start < 0.15
    assert h.engine.fallbacks[reason] == 1 and served(h)["servedBy"] == "fallback"
    assert f'rlsched_extender_fallbacks_total{{reason="{reason}"}} 1.0' in h.metrics.render().decode()


async def test_deadline_in_thread_mode_abandons_the_answer(tmp_path) -> None:
    h = harness(
        model_path=model_file(tmp_path, prefer="v100-4", sleep=0.2), deadline_ms=20, deadline_enforcement="thread"
    )
    async with TestClient(TestServer(h.app())) as c:
        start = time.perf_counter()
        _, body = await call(c, "filter", {"Pod": make_pod("p", gpus=1), "NodeNames": NAMES})
        assert time.perf_counter() - start < 0.15 and len(body["NodeNames"]) == 1
        # the policy thread is still stuck: the next request falls back at once
        _, body = await call(c, "filter", {"Pod": make_pod("q", gpus=1), "NodeNames": NAMES})
    assert h.engine.fallbacks["deadline"] == 1 and h.engine.fallbacks["busy"] == 1


def test_deadline_timer_interrupts_numpy_work() -> None:
    from rlsched.extender.policy import DeadlineTimer, PolicyDeadline

    timer = DeadlineTimer()

    def spin():
        x = np.ones(1000)
        while True:
            x = x * 1.0000001  # a loop of short numpy operations, like a policy

    start = time.perf_counter()
    with pytest.raises(PolicyDeadline):
        timer.run(spin, 0.02)
    assert time.perf_counter() - start < 0.2
    assert timer.run(lambda: 7, 0.02) == 7
    time.sleep(0.03)  # the timer was disarmed: nothing fires afterwards


async def test_shadow_mode_serves_the_heuristic_and_logs_the_policy(tmp_path) -> None:
    h = harness(model_path=model_file(tmp_path, prefer="t4-0"), mode="shadow")
    async with TestClient(TestServer(h.app())) as c:
        _, body = await call(c, "filter", {"Pod": make_pod("p", gpus=1), "NodeNames": NAMES})
        for _ in range(100):
            if len(h.ring):
                break
            await asyncio.sleep(0.01)
    rec = served(h)
    assert (
        rec["servedBy"] == "fallback" and rec["fallbackReason"] == "mode-shadow" and body["NodeNames"] == [rec["node"]]
    )
    assert rec["shadow"]["node"] == "t4-0" and rec["shadow"]["agree"] is (rec["node"] == "t4-0")


async def test_delay_and_reject_verdicts(tmp_path) -> None:
    h = harness(model_path=model_file(tmp_path, verdict="delay"))
    h.extender.clock = lambda: 1_795_000_000.0  # 2026-11-18T11:06:40Z
    pod = make_pod("p", gpus=1)
    async with TestClient(TestServer(h.app())) as c:
        _, body = await call(c, "filter", {"Pod": pod, "NodeNames": NAMES})
        assert (
            body["NodeNames"] == []
            and set(body["FailedNodes"]) == set(NAMES)
            and not body["FailedAndUnresolvableNodes"]
        )
        assert body["FailedNodes"]["v100-0"] == (
            "delayed by policy rl-scheduler until 2026-11-18T11:07:40Z (retry in 60s): cluster too fragmented"
        )
        _, pre = await call(c, "preempt", {"Pod": pod, "NodeNameToMetaVictims": {"v100-0": {"Pods": [{"UID": "z"}]}}})
        assert pre == {"NodeNameToMetaVictims": {}}  # a held-back pod must not evict anyone
        Path(h.engine.settings.model_path).write_text(json.dumps({"verdict": "reject", "version": "v2"}))
        await h.engine.poll()
        _, body = await call(c, "filter", {"Pod": make_pod("q", gpus=1), "NodeNames": NAMES})
    assert set(body["FailedAndUnresolvableNodes"]) == set(NAMES) and not body["FailedNodes"]
    assert body["FailedAndUnresolvableNodes"]["t4-0"].startswith("rejected by policy rl-scheduler")
    assert h.extender.counts == {"delayed": 1, "rejected": 1}


async def test_a_delay_for_a_pod_that_fits_nowhere_is_the_real_reasons(tmp_path) -> None:
    """A scorer that delays whatever fits: a pod that fits nowhere was answered "delayed by policy"
    with a new hold at every retry (never counted, its end moving on), the real reasons hidden, and
    preempt refused it as held back."""
    h = harness(model_path=model_file(tmp_path, verdict="delay"))
    pod = h.add_pod(make_pod("big", gpus=16))
    h.cache.set_pod(copy.deepcopy(pod))
    async with TestClient(TestServer(h.app())) as c:
        for _ in range(2):
            _, body = await call(c, "filter", {"Pod": pod, "NodeNames": NAMES})
            assert body["NodeNames"] == []
            reasons = {**body["FailedNodes"], **body["FailedAndUnresolvableNodes"]}
            assert reasons and not any("delayed by policy" in r for r in reasons.values()), reasons
    assert h.extender.holds.get(pod["metadata"]["uid"]) == 0


@pytest.mark.parametrize("watch_rv, sent_rv", [("2000", "2001"), ("2001", "2000")])
async def test_preempt_refuses_a_held_back_pod_whatever_version_the_watch_has(tmp_path, watch_rv, sent_rv) -> None:
    """kube-scheduler's informer was a version ahead of the extender's watch: filter remembered the
    policy's delay under the request's resourceVersion, preempt looked it up under the watch's, found
    nothing and answered victims for a pod the policy held back (evicted for a pod that then waits)."""
    a = make_pod("a", gpus=4, node="v100-0", uid="a")
    h = harness([a], model_path=model_file(tmp_path, verdict="delay"))
    pod = make_pod("p", gpus=4, uid="p", rv=watch_rv)
    h.add_pod(copy.deepcopy(pod))
    h.cache.set_pod(copy.deepcopy(pod))
    sent = copy.deepcopy(pod)
    sent["metadata"]["resourceVersion"] = sent_rv
    victims = {"v100-0": {"Pods": [{"UID": "a"}], "NumPDBViolations": 0}}
    async with TestClient(TestServer(h.app())) as c:
        _, body = await call(c, "filter", {"Pod": sent, "NodeNames": NAMES})
        assert body["NodeNames"] == [] and body["FailedNodes"]["v100-0"].startswith("delayed by policy")
        _, pre = await call(c, "preempt", {"Pod": sent, "NodeNameToMetaVictims": victims})
    assert pre == {"NodeNameToMetaVictims": {}}


@pytest.mark.parametrize("verdict", ["delay", "reject"])
@pytest.mark.parametrize("sent_rv", [None, "2001"], ids=["same-version", "watch-a-version-behind"])
async def test_bind_refuses_a_pod_the_policy_held_back(tmp_path, verdict: str, sent_rv: str | None) -> None:
    """Preempt refused a delayed or rejected pod, but bind bound it for a caller that skipped filter or
    ignored its answer; and, with the watch a version behind the pod filter saw, bind looked the
    verdict up under the watch's version, found none and bound the pod."""
    h = harness(model_path=model_file(tmp_path, verdict=verdict))
    pod = h.add_pod(make_pod("p", gpus=1, rv="2000"))
    h.cache.set_pod(copy.deepcopy(pod))
    sent = copy.deepcopy(pod)
    if sent_rv is not None:
        sent["metadata"]["resourceVersion"] = sent_rv
    async with TestClient(TestServer(h.app())) as c:
        _, body = await call(c, "filter", {"Pod": sent, "NodeNames": NAMES})
        assert body["NodeNames"] == []
        _, bound = await call(
            c, "bind", {"PodName": "p", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"], "Node": "v100-0"}
        )
    assert bound["Error"] == f"refused: the policy held pod default/p back ({verdict})"
    assert "nodeName" not in h.api.pods[("default", "p")]["spec"]
    assert h.metrics.registry.get_sample_value("rlsched_extender_binds_total", {"result": "refused"}) == 1


async def test_a_pod_held_three_times_is_placed_at_its_next_decision(tmp_path) -> None:
    """The simulator the delay head was trained in stops asking after three holds; served, nothing
    counted them, and in a cluster that stayed full a pod was held for good. A filter during a hold
    (kube-scheduler retries on every cluster event) is that hold again, not another."""
    h = harness(model_path=model_file(tmp_path, verdict="delay", hold=60.0))
    clock = {"now": 1000.0}
    h.cache.clock = lambda: clock["now"]
    pod = h.add_pod(make_pod("p", gpus=1))
    uid = pod["metadata"]["uid"]
    h.cache.set_pod(copy.deepcopy(pod))
    async with TestClient(TestServer(h.app())) as c:
        kept = []
        for step in (0, 1, 1, 60, 1, 60, 60):  # seconds before each filter
            clock["now"] += step
            h.extender.memory.pop(uid)
            h.cache.unreserve(uid)
            _, body = await call(c, "filter", {"Pod": pod, "NodeNames": NAMES})
            kept.append(bool(body["NodeNames"]))
        assert kept == [False, False, False, False, False, False, True]
        assert h.extender.holds.get(uid) == 3
        ref = {"PodName": "p", "PodNamespace": "default", "PodUID": uid, "Node": body["NodeNames"][0]}
        _, bound = await call(c, "bind", ref)
    assert bound["Error"] == "" and h.extender.holds.get(uid) == 0
    assert h.extender.counts == {"delayed": 6, "policy": 1}


async def test_a_delay_during_the_running_hold_names_its_end_and_the_time_left(tmp_path) -> None:
    """A delay decided again while the pod's hold ran is that hold (not counted again), but filter's
    answer and its record announced a new full hold from now: "until now + 60 s (retry in 60s)"."""
    h = harness(model_path=model_file(tmp_path, verdict="delay", hold=60.0))
    mono, wall = {"now": 1000.0}, {"now": 1_795_000_000.0}  # 2026-11-18T11:06:40Z
    h.cache.clock = lambda: mono["now"]
    h.extender.clock = lambda: wall["now"]
    pod = h.add_pod(make_pod("p", gpus=1))
    uid = pod["metadata"]["uid"]
    h.cache.set_pod(copy.deepcopy(pod))
    answers = []
    async with TestClient(TestServer(h.app())) as c:
        for step in (0, 45, 16):  # seconds before each filter: the hold's start, within it, after it
            mono["now"] += step
            wall["now"] += step
            h.extender.memory.pop(uid)
            h.cache.unreserve(uid)
            _, body = await call(c, "filter", {"Pod": pod, "NodeNames": NAMES})
            answers.append((body["FailedNodes"]["v100-0"], served(h)["retryAfterSeconds"]))
    why = "delayed by policy rl-scheduler until {} (retry in {}): cluster too fragmented"
    assert answers == [
        (why.format("2026-11-18T11:07:40Z", "60s"), 60.0),
        (why.format("2026-11-18T11:07:40Z", "15s"), 15.0),  # the same hold: its end, 15 s left
        (why.format("2026-11-18T11:08:41Z", "60s"), 60.0),  # a new hold
    ]
    assert h.extender.holds.get(uid) == 2


async def test_a_verdict_decided_at_prioritize_does_not_refuse_the_bind(tmp_path) -> None:
    """Prioritize decides again when the cluster changed after filter; a delay it found was kept in
    the decision memory, and bind refused a pod filter had passed."""
    h = harness(model_path=model_file(tmp_path, verdict="delay"))
    pod = h.add_pod(make_pod("p", gpus=1))
    h.cache.set_pod(copy.deepcopy(pod))
    async with TestClient(TestServer(h.app())) as c:
        status, scores = await call(c, "prioritize", {"Pod": pod, "NodeNames": ["v100-0", "v100-1"]})
        assert status == 200
        ref = {"PodName": "p", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"], "Node": "v100-0"}
        _, bound = await call(c, "bind", ref)
    assert bound["Error"] == ""


@pytest.mark.parametrize(
    ("meta", "field"),
    [({"uid": "u" * 5000}, "Pod.metadata.uid"), ({"name": "n" * 5000}, "Pod.metadata.name")],
)
async def test_filter_refuses_names_no_pod_can_have(meta: dict, field: str) -> None:
    """Filter kept a request's UID and name, of any length, in its decision memory, ring and holds:
    200 filters with a 4 MiB UID took 800 MiB."""
    h = harness()
    pod = make_pod("p", gpus=1)
    pod["metadata"].update(meta)
    async with TestClient(TestServer(h.app())) as c:
        for verb in ("filter", "prioritize"):
            status, body = await call(c, verb, {"Pod": pod, "NodeNames": NAMES})
            assert status == 400 and field in str(body)
    assert len(h.extender.memory) == 0 and h.cache.provisional == {}


@pytest.mark.parametrize("hold", ["inf", "nan", "-5", "0", "1e12"])
async def test_a_delay_with_an_impossible_hold_is_bad_output_not_a_500(tmp_path, hold: str) -> None:
    """A hold of infinity made filter raise (a 500 for every delayed pod); -5 s and 1e12 s were served."""
    h = harness(model_path=model_file(tmp_path, verdict="delay", hold=float(hold), prefer="v100-1"))
    async with TestClient(TestServer(h.app())) as c:
        status, body = await call(c, "filter", {"Pod": make_pod("p", gpus=1), "NodeNames": NAMES})
    assert status == 200 and len(body["NodeNames"]) == 1  # placed by the fallback
    assert h.extender.counts == {"fallback": 1}
    assert h.metrics.registry.get_sample_value("rlsched_extender_fallbacks_total", {"reason": "bad-output"}) == 1


async def test_a_reject_needs_no_hold(tmp_path) -> None:
    """A reject holds nothing: its retry field (0 from the operator's test model) is not checked."""
    h = harness(model_path=model_file(tmp_path, verdict="reject", hold=0.0))
    async with TestClient(TestServer(h.app())) as c:
        _, body = await call(c, "filter", {"Pod": make_pod("p", gpus=1), "NodeNames": NAMES})
    assert set(body["FailedAndUnresolvableNodes"]) == set(NAMES) and h.extender.counts == {"rejected": 1}


async def test_hot_reload_of_policy_file_and_model(tmp_path) -> None:
    good = model_file(tmp_path, prefer="v100-2", version="v1")
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"mode: off\nmodelPath: {good}\n")
    s = ExtenderSettings(policy_file=str(policy))
    h = Harness(copy.deepcopy(NODES), [], s, model_loader=fake_loader)
    assert h.engine.settings.mode == "off" and h.engine.model_info.version == "v1"
    policy.write_text(f"mode: active\nmodelPath: {good}\nfallback: bestfit\n")
    await h.engine.poll()
    assert h.engine.settings.mode == "active" and h.engine.fallback_scorer.name == "bestfit"
    Path(good).write_text(json.dumps({"prefer": "v100-3", "version": "v2"}) + " ")
    await h.engine.poll()
    assert h.engine.model_info.version == "v2"
    Path(good).write_text("{broken")
    await h.engine.poll()
    st = h.engine.status()
    assert st["model"]["version"] == "v2" and st["model"]["loaded"] and "JSONDecodeError" in st["model"]["error"]
    policy.write_text("mode: sideways\n")
    await h.engine.poll()
    assert h.engine.settings.mode == "active" and "sideways" in h.engine.status()["policyFileError"]
    text = h.metrics.render().decode()
    assert 'rlsched_extender_model_reloads_total{result="error"} 1.0' in text
    assert 'rlsched_extender_model_info{digest="dddddddddddddddd",mode="active",version="v2"} 1.0' in text


async def test_an_error_about_a_version_no_longer_there_is_cleared(tmp_path) -> None:
    """The model file overwritten with garbage, then restored: /status kept the garbage's error."""
    good = model_file(tmp_path, prefer="v100-2", version="v1")
    h = harness(model_path=good)
    text = Path(good).read_text()
    Path(good).write_text("{broken")
    await h.engine.poll()
    assert "JSONDecodeError" in h.engine.status()["model"]["error"]
    Path(good).write_text(text)
    await h.engine.poll()
    assert h.engine.status()["model"]["error"] is None and h.engine.model_info.version == "v1"


@pytest.mark.parametrize("target", ["/dev/zero", "fifo"])
async def test_a_model_path_that_is_not_a_regular_file_is_refused_at_once(tmp_path, target: str) -> None:
    """/dev/zero (or a FIFO) was hashed before it was checked: the poller never came back."""
    import os

    if target == "fifo":
        target = str(tmp_path / "fifo")
        os.mkfifo(target)
    s = ExtenderSettings(policy=PolicySettings(model_path=target), strict_model=False)
    h = Harness(copy.deepcopy(NODES), [], s, model_loader=fake_loader)
    assert h.engine.model is None and "is not a regular file" in h.engine.status()["model"]["error"]


async def test_a_bad_policy_file_at_start_is_reported_and_applied_once_fixed(tmp_path) -> None:
    """The operator wrote a bad file, the extender restarted: it exited 2 and crash-looped."""
    from rlsched.extender.settings import ConfigError

    policy = tmp_path / "policy.yaml"
    policy.write_text("mode: actve\n")
    with pytest.raises(ConfigError, match="actve"):
        Harness(copy.deepcopy(NODES), [], ExtenderSettings(policy_file=str(policy)), model_loader=fake_loader)
    s = ExtenderSettings(policy_file=str(policy), strict_model=False)
    h = Harness(copy.deepcopy(NODES), [], s, model_loader=fake_loader)
    assert h.engine.settings == s.policy and "actve" in h.engine.status()["policyFileError"]
    policy.write_text("mode: shadow\n")
    await h.engine.poll()
    assert h.engine.settings.mode == "shadow" and h.engine.status()["policyFileError"] is None


async def test_a_model_that_cannot_decide_is_not_loaded(tmp_path) -> None:
    h = harness(model_path=model_file(tmp_path, prefer="v100-1", version="ok"))
    Path(h.engine.settings.model_path).write_text(json.dumps({"fail": True, "always": True, "version": "bad"}))
    await h.engine.poll()
    st = h.engine.status()["model"]
    assert st["version"] == "ok" and "failed a test decision: RuntimeError: the model exploded" in st["error"]


async def test_unloadable_model_at_start(tmp_path) -> None:
    from rlsched.extender.settings import ConfigError

    with pytest.raises(ConfigError, match="model"):
        harness(model_path=str(tmp_path / "missing.npz"))
    s = ExtenderSettings(policy=PolicySettings(model_path=str(tmp_path / "missing.npz")), strict_model=False)
    h = Harness(copy.deepcopy(NODES), [], s, model_loader=fake_loader)
    assert h.engine.model is None and "missing.npz" in h.engine.status()["model"]["error"]


async def test_lost_connection_during_binding_keeps_cards_a_refusal_frees_them() -> None:
    h = harness()
    pod = h.add_pod(make_pod("p", gpus=4))
    uid = pod["metadata"]["uid"]
    h.api.fail["bind"] = ApiError(403, "Forbidden", "pods/binding is forbidden")
    res = await h.binder.bind(uid, "default", "p", "v100-0")
    assert res.result == "error" and uid not in h.cache.pods  # definitely not bound: released
    assert "check RBAC" in res.error
    h.api.fail["bind"] = ApiError(0, "Unreachable", "connection reset by peer")
    res = await h.binder.bind(uid, "default", "p", "v100-0")
    assert res.result == "uncertain" and h.cache.pods[uid].status == UNCERTAIN  # may be bound: kept


def test_deadline_timer_gives_sigalrm_back() -> None:
    """An outer SIGALRM user (pytest-timeout, say) keeps its handler and its remaining time."""
    import signal

    from rlsched.extender.policy import DeadlineTimer

    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        assert DeadlineTimer().run(lambda: 5, 0.01) == 5
        assert signal.getsignal(signal.SIGALRM) is not None and 0.1 < signal.getitimer(signal.ITIMER_REAL)[0] <= 0.2
        time.sleep(0.3)
        assert fired == [1]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


async def test_a_failing_model_file_is_retried_only_when_it_changes(tmp_path) -> None:
    good = model_file(tmp_path, prefer="v100-2", version="v1")
    h = harness(model_path=good)
    bad = tmp_path / "other.npz"
    bad.write_text("{broken")
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"modelPath: {bad}\n")
    h.engine.policy_file = str(policy)
    loads = []
    real_load = h.engine._load
    h.engine._load = lambda path: (loads.append(path), real_load(path))[1]
    await h.engine.poll()
    await h.engine.poll()
    await h.engine.poll()
    assert loads == [str(bad)]  # one attempt for the same bytes, not one per poll
    st = h.engine.status()["model"]
    assert st["version"] == "v1" and st["errorPath"] == str(bad) and st["fileDigest"]
    bad.write_text(json.dumps({"prefer": "v100-3", "version": "v3"}))
    await h.engine.poll()
    assert loads == [str(bad), str(bad)] and h.engine.status()["model"]["version"] == "v3"
    assert h.engine.status()["model"]["errorPath"] is None


def test_a_missing_policy_file_means_no_overrides(tmp_path) -> None:
    from rlsched.extender.settings import load_policy_file

    base = PolicySettings(fallback="bestfit")
    assert load_policy_file(tmp_path / "not-yet.yaml", base) == base


# -- explainLoad -------------------------------------------------------------------------------------


@pytest.mark.parametrize("explain", [True, False])
async def test_explain_load_records_the_node_chosen_without_load(explain: bool) -> None:
    """With node load known, ``explainLoad`` decides again as if it were not: the record and the
    counter say whether load changed the choice; the live load is untouched afterwards."""
    s = ExtenderSettings(policy=PolicySettings(fallback="target-load-packing"), explain_load=explain)
    h = Harness(copy.deepcopy(NODES), [], s, model_loader=fake_loader)
    pod = make_pod("p", cpu="1", gpus=1)
    async with TestClient(TestServer(h.app())) as c:
        _, body = await call(c, "filter", {"Pod": pod, "NodeNames": NAMES})
        unknown = served(h)
        # Trimaran's TargetLoadPacking packs towards 40 % CPU: the node closest to it under it wins
        h.cache.set_load({n: np.array([0.05, 0.1, np.nan, np.nan]) for n in NAMES})
        h.cache.set_load({"v100-3": np.array([0.35, 0.1, np.nan, np.nan])})
        live = h.cache.state.load
        _, body = await call(c, "filter", {"Pod": make_pod("q", cpu="1", gpus=1), "NodeNames": NAMES})
        known = served(h)
    assert "withoutLoad" not in unknown  # load unknown: nothing to explain
    assert body["NodeNames"] == ["v100-3"] and known["node"] == "v100-3"
    assert h.cache.state.load is live and live[h.cache.state.index["v100-3"], 0] == 0.35
    counter = h.metrics.registry.get_sample_value
    if not explain:
        assert (
            "withoutLoad" not in known and counter("rlsched_extender_load_explained_total", {"changed": "true"}) is None
        )
        return
    assert known["withoutLoad"] == {"node": unknown["node"], "changed": unknown["node"] != "v100-3"}
    assert known["withoutLoad"]["changed"], "the test needs a pod whose node load changes"
    assert counter("rlsched_extender_load_explained_total", {"changed": "true"}) == 1.0


async def test_explain_load_survives_a_failing_scorer(tmp_path) -> None:
    """A model that fails only when load is unknown: the decision stands, the record says why."""
    s = ExtenderSettings(policy=PolicySettings(model_path=model_file(tmp_path, prefer="v100-2")), explain_load=True)
    h = Harness(copy.deepcopy(NODES), [], s, model_loader=fake_loader)
    model = h.engine.model
    original = model.score

    def score(state, req, nodes):  # type: ignore[no-untyped-def]
        if np.isnan(state.load).all():
            raise RuntimeError("no load, no answer")
        return original(state, req, nodes)

    model.score = score  # type: ignore[method-assign]
    h.cache.set_load({"v100-0": np.array([0.5, 0.5, np.nan, np.nan])})
    async with TestClient(TestServer(h.app())) as c:
        _, body = await call(c, "filter", {"Pod": make_pod("p", gpus=1), "NodeNames": NAMES})
    assert body["NodeNames"] == ["v100-2"]
    assert served(h)["withoutLoad"] == {"error": "RuntimeError: no load, no answer"}


async def test_a_real_model_with_a_delay_head_delays_large_pods(tmp_path) -> None:
    """The model file's learned delay head, through the real loader: a 4-card pod is delayed, a 1-card pod placed."""
    from dataclasses import replace

    from test_delay_head import large_pods_head, with_head

    from rlsched.extender.policy import load_model

    headed = with_head(tmp_path, replace(large_pods_head(), bias=-2.0))  # logit 8·cards/8 − 2: holds above 2 cards
    s = ExtenderSettings(policy=PolicySettings(model_path=str(headed)))
    h = Harness(copy.deepcopy(NODES), [], s, model_loader=load_model)
    async with TestClient(TestServer(h.app())) as c:
        _, big = await call(c, "filter", {"Pod": make_pod("big", gpus=4, cpu="2", memory="4Gi"), "NodeNames": NAMES})
        _, small = await call(
            c, "filter", {"Pod": make_pod("small", gpus=1, cpu="2", memory="4Gi"), "NodeNames": NAMES}
        )
    assert big["NodeNames"] == [] and all("delayed by policy" in m for m in big["FailedNodes"].values())
    assert "the delay head rates waiting 60s" in next(iter(big["FailedNodes"].values()))
    assert len(small["NodeNames"]) == 1 and h.extender.counts == {"delayed": 1, "policy": 1}


async def test_filter_keeps_only_the_node_of_a_bind_whose_outcome_is_unknown() -> None:
    """A bind timed out (the binding may stand): kube-scheduler's retry is offered that node alone, and
    its bind there learns the outcome. Deciding again chose another node, which bind must refuse while
    the earlier binding may stand: under an overloaded API server every pod went round that loop
    (a decision, a refused bind, kube-scheduler's failure write) until the outcome was known."""
    h = harness()
    pod = h.add_pod(make_pod("p", gpus=4))
    uid = pod["metadata"]["uid"]
    h.api.fail["bind"] = 0.01  # stalls, then times out: outcome unknown
    res = await h.binder.bind(uid, "default", "p", "v100-3")
    assert res.result == "uncertain" and h.cache.pods[uid].status == UNCERTAIN
    del h.api.fail["bind"]
    kept = await h.extender.filter(ExtenderArgs(copy.deepcopy(pod), list(NAMES), None))
    assert kept["NodeNames"] == ["v100-3"] and kept["FailedNodes"] == {}
    assert h.metrics.registry.get_sample_value("rlsched_extender_decisions_total", {"outcome": "awaiting_bind"}) == 1
    h.api.pods[("default", "p")]["spec"]["nodeName"] = "v100-3"  # the timed-out binding had been written
    res = await h.binder.bind(uid, "default", "p", "v100-3")
    assert res.error == ""  # bound there: kube-scheduler learns it


async def test_filter_decides_as_usual_when_the_node_of_an_unknown_bind_is_not_offered() -> None:
    """kube-scheduler offers a share of the nodes: without the earlier bind's node, filter decides (and
    the earlier bind's cards stay held)."""
    h = harness()
    pod = h.add_pod(make_pod("p", gpus=4))
    uid = pod["metadata"]["uid"]
    h.api.fail["bind"] = 0.01
    await h.binder.bind(uid, "default", "p", "v100-3")
    offered = [n for n in NAMES if n != "v100-3"]
    kept = await h.extender.filter(ExtenderArgs(copy.deepcopy(pod), offered, None))
    assert kept["NodeNames"] and kept["NodeNames"][0] != "v100-3"
    assert h.cache.pods[uid].status == UNCERTAIN and h.cache.pods[uid].node == "v100-3"


async def test_binds_api_calls_share_one_deadline() -> None:
    """kube-scheduler waits httpTimeout for bind's answer: the GET (the watch has not delivered the pod)
    and the write share ``writeTimeoutS``, the GET at most READ_TIMEOUT_S of it."""
    from rlsched.extender.binder import READ_TIMEOUT_S

    h = harness()
    h.binder.kube.write_timeout_s = 1.0
    pod = h.add_pod(make_pod("p", gpus=1))
    given: dict[str, float] = {}
    get_pod, create_binding = h.api.get_pod, h.api.create_binding

    async def slow_get(namespace, name, timeout):
        given["get"] = timeout
        await asyncio.sleep(0.3)
        return await get_pod(namespace, name, timeout)

    async def recorded_create(namespace, name, uid, node, timeout, annotations=None):
        given["write"] = timeout
        return await create_binding(namespace, name, uid, node, timeout, annotations)

    h.api.get_pod, h.api.create_binding = slow_get, recorded_create
    res = await h.binder.bind(pod["metadata"]["uid"], "default", "p", "v100-0")
    assert res.error == ""
    assert 0.9 < given["get"] <= 1.0  # the deadline is nearer than READ_TIMEOUT_S
    assert 0.4 < given["write"] <= 0.7  # what the GET left
    h2 = harness()  # the default: 8 s together, the GET at most 2 of them
    pod = h2.add_pod(make_pod("p", gpus=1))
    get_pod, create_binding = h2.api.get_pod, h2.api.create_binding
    h2.api.get_pod, h2.api.create_binding = slow_get, recorded_create
    await h2.binder.bind(pod["metadata"]["uid"], "default", "p", "v100-0")
    assert given["get"] == READ_TIMEOUT_S and 7.5 < given["write"] <= 7.7


async def test_a_node_relabelled_while_a_bind_is_unknown_is_decided_afresh() -> None:
    """The earlier bind's node now has a card model the pod refuses (a MIG reconfiguration, say): the retry
    is decided afresh, and a bind there is refused rather than written again."""
    nodes = [make_node(f"v100-{i}", gpus=4, model="V100M16") for i in range(4)]
    pod = make_pod("p", gpus=1, gpu_models="V100M16")
    h = Harness(copy.deepcopy(nodes), [copy.deepcopy(pod)], ExtenderSettings())
    h.add_pod(pod)
    uid = pod["metadata"]["uid"]
    h.api.fail["bind"] = 0.01
    assert (await h.binder.bind(uid, "default", "p", "v100-3")).result == "uncertain"
    del h.api.fail["bind"]
    h.cache.set_node(make_node("v100-3", gpus=4, model="T4", rv="9999"))
    kept = await h.extender.filter(ExtenderArgs(copy.deepcopy(pod), [n["metadata"]["name"] for n in nodes], None))
    assert kept["NodeNames"] and kept["NodeNames"][0] != "v100-3"
    res = await h.binder.bind(uid, "default", "p", "v100-3")
    assert res.error and "model" in res.error and h.api.pods[("default", "p")]["spec"].get("nodeName") is None


async def test_the_bind_after_an_unknown_outcome_is_recorded_against_the_policys_choice() -> None:
    """kube-scheduler's status write after the failed bind gives the pod a new version; the retried bind's
    record still says whether it followed the policy."""
    nodes = [make_node(f"v100-{i}", gpus=4, model="V100M16") for i in range(4)]
    names = [n["metadata"]["name"] for n in nodes]
    pod = make_pod("p", gpus=4)
    h = Harness(copy.deepcopy(nodes), [copy.deepcopy(pod)], ExtenderSettings())
    h.add_pod(pod)
    uid = pod["metadata"]["uid"]
    chosen = (await h.extender.filter(ExtenderArgs(copy.deepcopy(pod), names, None)))["NodeNames"][0]
    h.api.fail["bind"] = 0.01
    await h.extender.bind(BindingArgs("p", "default", uid, chosen))
    del h.api.fail["bind"]
    retried = copy.deepcopy(pod)
    retried["metadata"]["resourceVersion"] = "2001"
    retried["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "SchedulerError"}]
    h.cache.set_pod(copy.deepcopy(retried))
    h.api.pods[("default", "p")] = copy.deepcopy(retried)
    assert (await h.extender.filter(ExtenderArgs(copy.deepcopy(retried), names, None)))["NodeNames"] == [chosen]
    assert (await h.extender.bind(BindingArgs("p", "default", uid, chosen))) == {"Error": ""}
    last = h.ring.read(0)["records"][-1]
    assert last["result"] == "ok" and last["policyNode"] == chosen and last["followedPolicy"] is True
