"""The hostile-input corpus (issue 10): quantities with exponents up to 1e9, 5,000-digit numbers,
unicode digits, huge negatives and path-traversal names, at every verb of the extender.

Every answer is a 200, 400 or 413 — never a 5xx — and no request holds the event loop: a probe
request runs back to back beside each hostile one, and the longest wait between two probe answers
while the hostile request is in flight must stay under :data:`STALL_S`. The same corpus goes
through the adapters the watches use (``pod_info``/``node_spec``) and the trace reader, and the parse
time of the worst inputs is bounded directly.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlsched.extender.objects import MAX_QUANTITY, ObjectError, node_spec, pod_info
from rlsched.extender.settings import ExtenderSettings, GpuConventions, ServerSettings
from rlsched.extender.testing import Harness, make_node, make_pod
from rlsched.extender.verbs import MAX_REASON_CHARS, NODE_NAMES_SLACK, UNKNOWN_NODE
from rlsched.policy.resources import QuantityError, count, cpu_milli, memory_bytes, memory_mib
from rlsched.policy.trace import TraceError, read_generic, read_openb_nodes

GPU = GpuConventions()
VERBS = ("filter", "prioritize", "bind", "preempt")
STALL_S = 0.100
"""No hostile request may hold the event loop longer than this (the issue's acceptance figure)."""
PARSE_BOUND_S = 0.050
"""Generous bound on one parse of the worst inputs (they take microseconds; 1e400000 took 5 s before)."""

LITERAL_QUANTITIES = [
    "1e999999",
    "1e400000",
    "1e200000",
    "1e100000",
    "1e5000",
    "1e999999999",
    "1E999999999",
    "1e+999999999",
    "-1e5000",
    "-1e999999999",
    "1e-999999999",
    "1" * 5000,
    "9" * 5000,
    "-" + "9" * 5000,
    "0." + "0" * 4998 + "1",
    "1" * 5000 + "Ki",
    "16384Ei",
    "99999999999999999999Ei",
    "1e99999999999999999999999999999999999999999999999999",
    "５００",
    "1_000",
    " 500 ",
    "500 ",
    "٣",
    "１e５",
    "0x1f4",
    "1e",
    "Infinity",
    "NaN",
    "-",
    "",
]
TRAVERSAL_NAMES = [
    "../../../nodes/X",
    "..",
    ".",
    "../x",
    "a/b",
    "%2e%2e%2fnodes%2fX",
    "x?watch=true",
    "x#frag",
    "x\x00y",
    "nodes/../../api",
    "ｇ0",
    "g0/",
    "/g0",
    "a" * 5000,
]


def _pod_with(field: str, value: Any, name: str = "hostile", uid: str = "hostile") -> dict:
    """A pending pod with ``value`` at one of the places a quantity or a number is read from."""
    pod = make_pod(name, gpus=1, uid=uid)
    container = pod["spec"]["containers"][0]
    requests = container["resources"]["requests"]
    if field in ("cpu", "memory", GPU.gpu_resource, GPU.gpu_milli_resource):
        if field == GPU.gpu_milli_resource:
            requests.pop(GPU.gpu_resource, None)
            container["resources"]["limits"].pop(GPU.gpu_resource, None)
        requests[field] = value
    elif field == "limits.cpu":
        del requests["cpu"]
        container["resources"]["limits"]["cpu"] = value
    elif field == "initContainers.cpu":
        pod["spec"]["initContainers"] = [
            {"name": "init", "resources": {"requests": {"cpu": value}}},
            {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"memory": value}}},
        ]
    elif field == "overhead.memory":
        pod["spec"]["overhead"] = {"memory": value}
    elif field == "resources.cpu":
        pod["spec"]["resources"] = {"requests": {"cpu": value}}
    elif field == "annotation.gpu-milli":
        requests.pop(GPU.gpu_resource, None)
        container["resources"]["limits"].pop(GPU.gpu_resource, None)
        pod["metadata"]["annotations"][GPU.gpu_milli_annotation] = value if isinstance(value, str) else str(value)
    elif field == "annotation.cards":
        pod["spec"]["nodeName"] = "g0"
        pod["metadata"]["annotations"][GPU.cards_annotation] = value if isinstance(value, str) else str(value)
        pod["metadata"]["annotations"][GPU.assigned_node_annotation] = "g0"
    else:  # pragma: no cover - a typo in the test
        raise AssertionError(field)
    return pod


POD_FIELDS = [
    "cpu",
    "memory",
    GPU.gpu_resource,
    GPU.gpu_milli_resource,
    "limits.cpu",
    "initContainers.cpu",
    "overhead.memory",
    "resources.cpu",
    "annotation.gpu-milli",
    "annotation.cards",
]
NODE_FIELDS = ["cpu", "memory", GPU.gpu_resource, "price"]


def _node_with(field: str, value: Any, name: str = "g9") -> dict:
    node = make_node(name, gpus=4)
    if field == "price":
        node["metadata"]["annotations"][GPU.node_price_annotation] = value if isinstance(value, str) else str(value)
    else:
        node["status"]["allocatable"][field] = value
    return node


# -- hypothesis strategies -------------------------------------------------------------------------

_mantissas = st.one_of(
    st.text("0123456789", min_size=1, max_size=6),
    st.builds(
        lambda a, b: f"{a}.{b}", st.text("0123456789", max_size=4), st.text("0123456789", min_size=1, max_size=4)
    ),
)
_signs = st.sampled_from(["", "", "-", "+"])
_suffixes = st.sampled_from(["", "m", "k", "M", "G", "Ki", "Mi", "Gi", "Ei", "E", "n", "u"])
quantities = st.one_of(
    # exponents up to 1e9 either way
    st.builds(
        lambda s, m, e, x: f"{s}{m}{x}{e}", _signs, _mantissas, st.integers(-(10**9), 10**9), st.sampled_from("eE")
    ),
    st.builds(lambda s, m, x: f"{s}{m}{x}", _signs, _mantissas, _suffixes),
    # numbers of up to 5,000 digits, positive or negative, with or without a suffix
    st.builds(lambda s, n, d, x: s + d * n + x, _signs, st.integers(1, 5000), st.sampled_from("19"), _suffixes),
    # unicode digits, underscores and spaces Python's int() would accept
    st.text(st.characters(categories=["Nd"]), min_size=1, max_size=6),
    st.builds(lambda a, b: f"{a}_{b}", st.integers(0, 999), st.integers(0, 999)),
    st.builds(lambda q: f" {q} ", st.integers(0, 10**6)),
    st.sampled_from(LITERAL_QUANTITIES),
    st.text(max_size=30),
    # JSON numbers (orjson reads huge ones as floats or refuses them)
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
)
names = st.one_of(st.sampled_from(TRAVERSAL_NAMES), st.text(max_size=40), st.integers(64, 5000).map(lambda n: "n" * n))


# -- the server and the stall probe ----------------------------------------------------------------

NODES = [make_node(f"g{i}", gpus=4) for i in range(4)] + [make_node("c0")]
NAMES = [n["metadata"]["name"] for n in NODES]
PROBE = orjson.dumps({"Pod": make_pod("probe", cpu="100m", memory="1Mi", uid="probe"), "NodeNames": ["c0"]})


class Server:
    """One extender (built with extender.testing) on a private loop; hypothesis drives sync tests."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        s = ExtenderSettings(server=ServerSettings(max_body_bytes=1024 * 1024))
        self.h = Harness(copy.deepcopy(NODES), [make_pod("v", gpus=1, node="g0", uid="victim")], s)
        self.client = TestClient(TestServer(self.h.app()), loop=self.loop)
        self.loop.run_until_complete(self.client.start_server())
        self.serial = itertools.count()

    async def _post(self, verb: str, body: bytes) -> tuple[int, Any]:
        r = await self.client.post(f"/{verb}", data=body, headers={"Content-Type": "application/json"})
        return r.status, orjson.loads(await r.read())

    async def _probed(self, verb: str, body: bytes) -> tuple[int, Any, float]:
        """Post ``body`` while a probe filter runs back to back; the longest gap between probe answers."""
        answers: list[float] = []
        stop = asyncio.Event()
        started = asyncio.Event()

        async def probe() -> None:
            answers.append(time.perf_counter())
            while not stop.is_set():
                r = await self.client.post("/filter", data=PROBE, headers={"Content-Type": "application/json"})
                await r.read()
                assert r.status == 200
                answers.append(time.perf_counter())
                started.set()

        task = asyncio.ensure_future(probe())
        await started.wait()  # the probe is in flight before the hostile request goes out
        status, answer = await self._post(verb, body)
        stop.set()
        await task
        return status, answer, max(b - a for a, b in itertools.pairwise(answers))

    def post(self, verb: str, payload: Any) -> tuple[int, Any, float]:
        """Status, answer and stall; a stall over the bound is measured twice more before it counts
        (the test box is shared, so one slow probe may be someone else's CPU; a real stall repeats)."""
        body = payload if isinstance(payload, bytes) else orjson.dumps(payload)
        status, answer, stall = self.loop.run_until_complete(self._probed(verb, body))
        for _ in range(2):
            if stall < STALL_S:
                break
            # A repeated bind answers differently once the first succeeded; its stall is what counts here.
            stall = min(stall, self.loop.run_until_complete(self._probed(verb, body))[2])
        return status, answer, stall

    def add_pod(self, pod: dict) -> None:
        self.h.add_pod(pod)

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.close()


def check(verb: str, status: int, answer: Any, stall: float) -> None:
    assert status in (200, 400, 413), (verb, status, answer)
    if status != 200:
        assert isinstance(answer, dict) and answer.get("Error"), answer
        assert len(answer["Error"]) < 1000, answer["Error"][:200]  # no echo of a 5,000-digit number
    assert stall < STALL_S, f"{verb}: the event loop was held {stall * 1000:.0f} ms"


def payloads(server: Server, verb: str, pod: dict, name_field: str | None = None, name: str = "") -> dict:
    """A request of ``verb`` about ``pod``; ``name_field`` puts a hostile name where names go."""
    if verb in ("filter", "prioritize"):
        names = list(NAMES) + ([name] if name_field else [])
        return {"Pod": pod, "NodeNames": names}
    if verb == "bind":
        meta = pod["metadata"]
        args = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": "g1"}
        if name_field:
            args[name_field] = name
        return args
    victims: dict[str, Any] = {"g0": {"Pods": [{"UID": "victim"}], "NumPDBViolations": 0}}
    if name_field:
        victims[name] = {"Pods": [{"UID": name or "x"}], "NumPDBViolations": 0}
    return {"Pod": pod, "NodeNameToMetaVictims": victims}


# -- the literal cases of the issue, at every verb --------------------------------------------------


@pytest.mark.parametrize("value", LITERAL_QUANTITIES)
@pytest.mark.parametrize("verb", VERBS)
def test_literal_quantities_at_every_verb(server, verb, value) -> None:
    for field in POD_FIELDS:
        n = next(server.serial)
        pod = _pod_with(field, value, name=f"lit-{n}", uid=f"lit-{n}")
        if verb == "bind":
            server.add_pod(pod)  # bind reads the pod's spec from the API, never from the request
        status, answer, stall = server.post(verb, payloads(server, verb, pod))
        check(verb, status, answer, stall)


@pytest.mark.parametrize("value", ["1e999999", "1e400000", "1e999999999", "1" * 5000, "５", "-1e5000"])
def test_hostile_nodes_in_full_node_mode(server, value) -> None:
    for field in NODE_FIELDS:
        nodes = copy.deepcopy(NODES) + [_node_with(field, value)]
        pod = make_pod("full", gpus=1, uid="full")
        for verb in ("filter", "prioritize"):
            status, answer, stall = server.post(verb, {"Pod": pod, "Nodes": {"items": nodes}})
            check(verb, status, answer, stall)


@pytest.mark.parametrize("name", TRAVERSAL_NAMES)
@pytest.mark.parametrize("verb", VERBS)
def test_traversal_names_at_every_verb(server, verb, name) -> None:
    fields = ("PodName", "PodNamespace", "Node", "PodUID") if verb == "bind" else ("NodeNames",)
    for field in fields:
        n = next(server.serial)
        pod = make_pod(f"trav-{n}", gpus=1, uid=f"trav-{n}")
        if verb == "bind":
            server.add_pod(pod)  # bindable but for the hostile name
        status, answer, stall = server.post(verb, payloads(server, verb, pod, field, name))
        check(verb, status, answer, stall)
        if verb == "bind":
            assert status == 400 or answer["Error"], answer  # never bound under a name that is no name


def test_request_beyond_any_node_is_unschedulable_with_a_reason(server) -> None:
    """kube-apiserver stores cpu: "1e999999"; the filter says why no node fits, in words."""
    pod = make_pod("huge", gpus=1, cpu="1e999999", memory="1e400000", uid="huge")
    status, answer, _ = server.post("filter", {"Pod": pod, "NodeNames": NAMES})
    assert status == 200 and answer["NodeNames"] == []
    reasons = {**answer["FailedNodes"], **answer["FailedAndUnresolvableNodes"]}
    assert set(reasons) == set(NAMES)
    for reason in reasons.values():
        assert "insufficient cpu (pod requests more than any node holds)" in reason, reason
        assert "insufficient memory (pod requests more than any node holds)" in reason, reason
        assert "9007199254740992" not in reason
    assert set(answer["FailedAndUnresolvableNodes"]) == set(NAMES)  # preemption cannot help


# -- the hypothesis corpus -------------------------------------------------------------------------

SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


@SETTINGS
@given(
    verb=st.sampled_from(VERBS),
    field=st.sampled_from(POD_FIELDS),
    value=quantities,
    name_field=st.sampled_from([None, "PodName", "PodNamespace", "Node", "PodUID"]),
    name=names,
)
def test_hypothesis_corpus_at_every_verb(server, verb, field, value, name_field, name) -> None:
    n = next(server.serial)
    pod = _pod_with(field, value, name=f"hyp-{n}", uid=f"hyp-{n}")
    if verb == "bind":
        server.add_pod(pod)
    elif name_field is not None:
        name_field = "NodeNames"
    status, answer, stall = server.post(verb, payloads(server, verb, pod, name_field, name))
    check(verb, status, answer, stall)


@SETTINGS
@given(field=st.sampled_from(NODE_FIELDS), value=quantities, verb=st.sampled_from(["filter", "prioritize"]))
def test_hypothesis_nodes_in_full_node_mode(server, field, value, verb) -> None:
    nodes = copy.deepcopy(NODES[:2]) + [_node_with(field, value)]
    status, answer, stall = server.post(verb, {"Pod": make_pod("full", gpus=1, uid="full"), "Nodes": {"items": nodes}})
    check(verb, status, answer, stall)


# -- the watch side: the adapters raise ObjectError or read the object, in bounded time -------------


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """Best of three (the box is shared), of a call that may raise."""
    best, outcome = float("inf"), None
    for _ in range(3):
        start = time.perf_counter()
        try:
            outcome = fn()
        except (ObjectError, QuantityError, TraceError) as exc:
            outcome = exc
        best = min(best, time.perf_counter() - start)
    return outcome, best


@pytest.mark.parametrize("value", LITERAL_QUANTITIES)
def test_pod_and_node_adapters_on_the_corpus(value) -> None:
    for field in POD_FIELDS:
        outcome, took = _timed(lambda field=field: pod_info(_pod_with(field, value), GPU, "Pod"))
        assert took < PARSE_BOUND_S, (field, took)
        if isinstance(outcome, ObjectError):
            assert outcome.field.startswith("Pod.") and len(str(outcome)) < 300, str(outcome)[:300]
        else:
            spec = outcome.spec
            assert spec is None or max(spec.cpu_milli, spec.memory_mib, spec.num_gpu) <= MAX_QUANTITY
    for field in NODE_FIELDS:
        outcome, took = _timed(lambda field=field: node_spec(_node_with(field, value), GPU))
        assert took < PARSE_BOUND_S, (field, took)
        if isinstance(outcome, ObjectError):
            assert outcome.field.startswith("node.") and len(str(outcome)) < 300, str(outcome)[:300]


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(POD_FIELDS), value=quantities)
def test_pod_adapter_raises_only_object_errors(field, value) -> None:
    try:
        info = pod_info(_pod_with(field, value), GPU, "Pod")
    except ObjectError as exc:
        assert len(str(exc)) < 300
    else:
        assert info.spec is None or info.spec.cpu_milli <= MAX_QUANTITY
        assert len(info.problem) < 300


@pytest.mark.parametrize(
    "value",
    [
        "1e400000",
        "1e999999",
        "1e999999999",
        "-1e999999999",
        "1e-999999999",
        "9" * 64,
        "9" * 5000,
        "1" * 5000 + "Ki",
        "99999999999999999999Ei",
    ],
)
@pytest.mark.parametrize("fn", [cpu_milli, memory_bytes, memory_mib, count])
def test_parse_time_of_the_worst_inputs_is_bounded(fn, value) -> None:
    """An algorithmic bound: the exponent never becomes a power of ten (1e400000 took 5.4 s per event)."""
    outcome, took = _timed(lambda: fn(value, saturate=True))
    assert took < PARSE_BOUND_S, took
    assert isinstance(outcome, QuantityError) or outcome in (1, MAX_QUANTITY)  # refused, 1n rounded up, or saturated


# -- the trace reader: the same parser and bounds, errors with file:line --------------------------


@pytest.mark.parametrize("value", ["1e999999", "1e400000", "-1e5000", "'" + "1" * 5000 + "'", "'５'", "1" * 5000])
def test_trace_reader_bounds(tmp_path: Path, value) -> None:
    path = tmp_path / "trace.yaml"
    path.write_text(f"nodes:\n  - name: n\n    memory: 1Gi\n    cpu: {value}\n")
    outcome, took = _timed(lambda: read_generic(path))
    assert took < PARSE_BOUND_S * 4, took  # includes YAML parsing
    assert isinstance(outcome, TraceError), outcome
    message = str(outcome)
    assert message.startswith(f"{path}:4:") and len(message) < 300, message


@pytest.mark.parametrize("cell", ["٣٠٠", "1_000", "9" * 5000, "1e999999", str(2**53)])
def test_openb_integer_cells_are_ascii_and_bounded(tmp_path: Path, cell) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text(f"sn,cpu_milli,memory_mib,gpu,model\nn1,{cell},1024,0,\n")
    outcome, took = _timed(lambda: read_openb_nodes(path))
    assert took < PARSE_BOUND_S, took
    assert isinstance(outcome, TraceError) and str(outcome).startswith(f"{path}:2: column 'cpu_milli':"), outcome
    assert len(str(outcome)) < 200


def test_trace_count_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "trace.yaml"
    path.write_text("pods:\n  - name: p\n    count: 1000000000000\n")
    outcome, took = _timed(lambda: read_generic(path))
    assert isinstance(outcome, TraceError) and "pods[0].count" in str(outcome) and took < PARSE_BOUND_S


# -- requests that name far more nodes than the cluster has ---------------------------------------


@pytest.mark.parametrize("verb", ["filter", "prioritize", "preempt"])
def test_more_names_than_the_cluster_can_explain_are_400(server, verb) -> None:
    """Five nodes in the cache: 2 × 5 + 1,000 names at most; one more is a 400 naming the field, not
    an answer with a reason per made-up name."""
    limit = 2 * len(NODES) + NODE_NAMES_SLACK
    pod = make_pod("many", gpus=1, uid="many")
    if verb == "preempt":
        victims = {f"x{i}": {"Pods": [{"UID": "victim"}], "NumPDBViolations": 0} for i in range(limit + 1)}
        status, answer, stall = server.post(verb, {"Pod": pod, "NodeNameToMetaVictims": victims})
    else:
        status, answer, stall = server.post(verb, {"Pod": pod, "NodeNames": [f"x{i}" for i in range(limit + 1)]})
    check(verb, status, answer, stall)
    assert status == 400 and f"at most {limit}" in answer["Error"], answer
    if verb != "preempt":
        names = [*NAMES, *(f"x{i}" for i in range(limit - len(NAMES)))]
        status, answer, _ = server.post(verb, {"Pod": pod, "NodeNames": names})
        assert status == 200, answer


def test_unknown_names_get_one_short_reason_each(server) -> None:
    unknown = [f"not-yet-{i}" for i in range(500)]
    pod = make_pod("u", gpus=1, uid="u")
    status, answer, stall = server.post("filter", {"Pod": pod, "NodeNames": [*NAMES, *unknown]})
    check("filter", status, answer, stall)
    assert status == 200 and set(unknown) <= set(answer["FailedNodes"])  # the known nodes may be full by now
    assert {answer["FailedNodes"][n] for n in unknown} == {UNKNOWN_NODE} and len(UNKNOWN_NODE) < 100


def test_a_reason_copied_to_every_node_is_short(server) -> None:
    """An unreadable pod is unschedulable with its reason on every node: that reason is cut short."""
    pod = _pod_with("cpu", "1" * 5000 + "Ki", name="long", uid="long")
    status, answer, stall = server.post("filter", {"Pod": pod, "NodeNames": NAMES})
    check("filter", status, answer, stall)
    reasons = {**answer["FailedNodes"], **answer["FailedAndUnresolvableNodes"]}
    assert status == 200 and set(reasons) == set(NAMES)
    assert all(len(r) <= MAX_REASON_CHARS for r in reasons.values()), reasons


@pytest.mark.parametrize("pdb", [-1, 2**63, 2**64 - 1])
def test_pdb_violations_outside_an_int64_count_are_400(server, pdb) -> None:
    victims = {"g0": {"Pods": [{"UID": "victim"}], "NumPDBViolations": pdb}}
    status, answer, stall = server.post("preempt", {"Pod": make_pod("p", gpus=1), "NodeNameToMetaVictims": victims})
    check("preempt", status, answer, stall)
    assert status == 400 and "NumPDBViolations" in answer["Error"], answer


async def test_the_default_body_limit_refuses_a_large_body_without_parsing_it() -> None:
    """The default ``server.maxBodyBytes`` (8 MiB): a cache-capable request is ~0.1 MB at 5,000 nodes."""
    assert ServerSettings().max_body_bytes == 8 * 1024 * 1024
    h = Harness(copy.deepcopy(NODES), [], ExtenderSettings())
    body = orjson.dumps({"Pod": make_pod("p", gpus=1), "NodeNames": [f"n{i:07d}" for i in range(900_000)]})
    assert len(body) > 8 * 1024 * 1024
    async with TestClient(TestServer(h.app())) as client:
        r = await client.post("/filter", data=body, headers={"Content-Type": "application/json"})
        assert r.status == 413 and "maxBodyBytes" in (await r.json())["Error"]
