"""Random and mutated payloads at every verb: answers are 200, 400 or 413 — never a 500, never a crash —
and a 200 always has the protocol's shape. Unknown extra fields are ignored."""

from __future__ import annotations

import asyncio
import copy

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlsched.extender.settings import ExtenderSettings, ServerSettings
from rlsched.extender.testing import Harness, make_node, make_pod

NODES = [make_node(f"g{i}", gpus=4) for i in range(4)] + [make_node("c0")]
NAMES = [n["metadata"]["name"] for n in NODES]
VERBS = ("filter", "prioritize", "bind", "preempt")

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)


def valid_payloads() -> dict[str, list[dict]]:
    pod = make_pod("p", gpu_milli=400, uid="fuzz-p")
    whole = make_pod("w", gpus=2, uid="fuzz-w", gpu_models="V100M16")
    return {
        "filter": [
            {"Pod": pod, "NodeNames": NAMES, "Nodes": None},
            {"Pod": whole, "Nodes": {"items": NODES}, "NodeNames": None},
        ],
        "prioritize": [{"Pod": pod, "NodeNames": NAMES}, {"Pod": whole, "Nodes": {"items": NODES}}],
        "bind": [{"PodName": "p", "PodNamespace": "default", "PodUID": "fuzz-p", "Node": "g1"}],
        "preempt": [
            {"Pod": whole, "NodeNameToMetaVictims": {"g0": {"Pods": [{"UID": "x"}], "NumPDBViolations": 0}}},
            {"Pod": whole, "NodeNameToVictims": {"g1": {"Pods": [pod], "NumPDBViolations": 1}}},
        ],
    }


def paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:6]):
            yield from paths(v, prefix + (i,))


def mutate(doc, path, action, value):
    doc = copy.deepcopy(doc)
    if not path:
        return value if action != "keep" else doc
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if action == "delete":
        if isinstance(parent, dict):
            del parent[last]
        else:
            parent.pop(last)
    elif action == "replace":
        parent[last] = value
    elif action == "extra" and isinstance(parent, dict):
        parent[f"unknownField{len(parent)}"] = value
    return doc


class Server:
    """One extender on a private loop for all examples (hypothesis drives sync tests)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        s = ExtenderSettings(server=ServerSettings(max_body_bytes=256 * 1024))
        self.h = Harness(copy.deepcopy(NODES), [make_pod("v", gpus=1, node="g0", uid="x")], s)
        self.h.add_pod(make_pod("p", gpu_milli=400, uid="fuzz-p"))
        self.client = TestClient(TestServer(self.h.app()), loop=self.loop)
        self.loop.run_until_complete(self.client.start_server())

    def post(self, verb: str, body: bytes) -> tuple[int, object]:
        async def go():
            r = await self.client.post(f"/{verb}", data=body, headers={"Content-Type": "application/json"})
            raw = await r.read()
            return r.status, orjson.loads(raw)

        return self.loop.run_until_complete(go())

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.close()


def check(verb: str, status: int, body, payload=None) -> None:
    assert status in (200, 400, 413), (status, body)
    if status != 200:
        assert isinstance(body, dict) and isinstance(body.get("Error"), str) and body["Error"]
        return
    if verb == "filter":
        assert (
            set(body) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
            and body["Error"] == ""
        )
        if isinstance(payload, dict) and body["NodeNames"] is not None:
            sent = payload.get("NodeNames") or []
            assert set(body["NodeNames"]) <= set(sent)
    elif verb == "prioritize":
        assert isinstance(body, list) and all(0 <= e["Score"] <= 10 and isinstance(e["Score"], int) for e in body)
    elif verb == "bind":
        assert set(body) == {"Error"}
    else:
        assert set(body) == {"NodeNameToMetaVictims"}
        for node, v in body["NodeNameToMetaVictims"].items():
            assert v["Pods"], node  # a node without victims would be an error in kube-scheduler


SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


@SETTINGS
@given(verb=st.sampled_from(VERBS), value=json_values)
def test_random_json(server, verb, value) -> None:
    status, body = server.post(verb, orjson.dumps(value))
    check(verb, status, body)


@SETTINGS
@given(verb=st.sampled_from(VERBS), raw=st.binary(max_size=200))
def test_random_bytes(server, verb, raw) -> None:
    status, body = server.post(verb, raw)
    check(verb, status, body)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(data=st.data())
def test_mutated_payloads(server, data) -> None:
    verb = data.draw(st.sampled_from(VERBS))
    doc = data.draw(st.sampled_from(valid_payloads()[verb]))
    all_paths = list(paths(doc))
    path = data.draw(st.sampled_from(all_paths))
    action = data.draw(st.sampled_from(["delete", "replace", "replace", "extra"]))
    value = data.draw(json_values)
    payload = mutate(doc, path, action, value)
    status, body = server.post(verb, orjson.dumps(payload))
    check(verb, status, body, payload)


def test_unknown_fields_are_ignored_and_lowercase_keys_accepted(server) -> None:
    pod = make_pod("p", gpus=1, uid="lower")
    status, body = server.post("filter", orjson.dumps({"pod": pod, "nodenames": NAMES, "NewField": {"x": 1}}))
    assert status == 200 and len(body["NodeNames"]) == 1


def test_oversized_body_is_413_and_the_server_carries_on(server) -> None:
    status, body = server.post("filter", b'{"Pod": "' + b"x" * (300 * 1024) + b'"}')
    assert status == 413 and "maxBodyBytes" in body["Error"]
    status, body = server.post("filter", orjson.dumps(valid_payloads()["filter"][0]))
    assert status == 200


@pytest.mark.parametrize(
    "verb, payload, field",
    [
        ("filter", {"NodeNames": ["g0"]}, "Pod"),
        ("filter", {"Pod": [], "NodeNames": ["g0"]}, "Pod"),
        ("filter", {"Pod": {"metadata": {"name": "p"}}}, "NodeNames"),
        ("filter", {"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["g0", 7]}, "NodeNames[1]"),
        (
            "filter",
            {"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [{"metadata": {}}]}},
            "Nodes.items[0].metadata.name",
        ),
        (
            "prioritize",
            {
                "Pod": {"metadata": {"name": "p"}, "spec": {"containers": [{"resources": {"limits": {"cpu": "1x"}}}]}},
                "NodeNames": [],
            },
            "Pod.spec.containers[0].resources.requests.cpu",
        ),
        ("bind", {"PodName": "p", "PodNamespace": "default", "Node": "g0"}, "PodUID"),
        ("bind", {"PodName": "p", "PodNamespace": "default", "PodUID": 5, "Node": "g0"}, "PodUID"),
        (
            "preempt",
            {"Pod": {"metadata": {"name": "p"}}, "NodeNameToMetaVictims": {"g0": {"Pods": [{}]}}},
            "NodeNameToMetaVictims.g0.Pods[0].UID",
        ),
        (
            "preempt",
            {"Pod": {"metadata": {"name": "p"}}, "NodeNameToVictims": {"g0": {"Pods": [{"metadata": {}}]}}},
            "NodeNameToVictims.g0.Pods[0].metadata.uid",
        ),
    ],
)
def test_400_names_the_field(server, verb, payload, field) -> None:
    status, body = server.post(verb, orjson.dumps(payload))
    assert status == 400 and body["Error"].startswith(field + ":"), body
