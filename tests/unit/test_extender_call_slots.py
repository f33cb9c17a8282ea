"""The API client's call slots: a call that found every connection busy until its time ran out was
never sent, and bind knows then that nothing was written."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from rlsched.extender import kubeapi
from rlsched.extender.kubeapi import NOT_SENT, ApiError, KubeApi
from rlsched.extender.settings import ConfigError, ExtenderSettings, KubeSettings, merge
from rlsched.extender.testing import Harness, make_node, make_pod
from rlsched.extender.wire import BindingArgs


class SlowBindings:
    """A binding endpoint that holds every request until ``go`` is set, counting what arrived."""

    def __init__(self) -> None:
        self.arrived: list[str] = []
        self.go = asyncio.Event()
        self.app = web.Application()
        self.app.router.add_post("/api/v1/namespaces/{ns}/pods/{name}/binding", self.bind)

    async def bind(self, request: web.Request) -> web.Response:
        self.arrived.append(request.match_info["name"])
        await self.go.wait()
        return web.json_response({"kind": "Status", "status": "Success", "code": 201}, status=201)


async def test_a_call_that_waits_out_its_time_for_a_slot_is_not_sent() -> None:
    fake = SlowBindings()
    waits: list[float] = []
    async with TestServer(fake.app) as ts:
        api = KubeApi(str(ts.make_url("")), None, lambda: None, call_slots=1)
        api.on_slot_wait = waits.append
        first = asyncio.create_task(api.create_binding("default", "a", "uid-a", "n", 5.0))
        while fake.arrived != ["a"]:
            await asyncio.sleep(0.01)
        with pytest.raises(ApiError) as info:
            await api.create_binding("default", "b", "uid-b", "n", 0.2)
        assert info.value.status == 0 and info.value.reason == NOT_SENT and "not sent" in str(info.value)
        third = asyncio.create_task(api.create_binding("default", "c", "uid-c", "n", 5.0))
        await asyncio.sleep(0.05)
        assert fake.arrived == ["a"]  # b never left; c waits for a's slot
        fake.go.set()
        await first
        await third
        await api.close()
    assert fake.arrived == ["a", "c"]
    # a never waited; b waited its whole 0.2 s in vain, c until a's answer: both counted.
    assert len(waits) == 2 and waits[0] == 0.2 and waits[1] > 0


async def test_a_slot_that_comes_free_too_late_is_not_used() -> None:
    """b gets its slot with less than MIN_SEND_S of its time left: sent, it would only time out as an
    unknown outcome, so it is not sent at all."""
    fake = SlowBindings()
    async with TestServer(fake.app) as ts:
        api = KubeApi(str(ts.make_url("")), None, lambda: None, call_slots=1)
        first = asyncio.create_task(api.create_binding("default", "a", "uid-a", "n", 5.0))
        while fake.arrived != ["a"]:
            await asyncio.sleep(0.01)
        late = asyncio.create_task(api.create_binding("default", "b", "uid-b", "n", 0.3))
        await asyncio.sleep(0.3 - kubeapi.MIN_SEND_S / 2)
        fake.go.set()  # a is answered, its slot comes free with b's time almost gone
        await first
        with pytest.raises(ApiError) as info:
            await late
        assert info.value.reason == NOT_SENT
        await api.create_binding("default", "c", "uid-c", "n", 5.0)  # the slot b gave back
        await api.close()
    assert fake.arrived == ["a", "c"]


async def test_a_refused_connection_is_not_sent() -> None:
    api = KubeApi("http://127.0.0.1:1", None, lambda: None)
    with pytest.raises(ApiError) as info:
        await api.create_binding("default", "p", "uid-p", "n", 2.0)
    await api.close()
    assert info.value.status == 0 and info.value.reason == NOT_SENT


async def test_a_timeout_after_sending_is_not_a_not_sent() -> None:
    fake = SlowBindings()
    async with TestServer(fake.app) as ts:
        api = KubeApi(str(ts.make_url("")), None, lambda: None)
        with pytest.raises(ApiError) as info:
            await api.create_binding("default", "a", "uid-a", "n", 0.2)
        fake.go.set()
        await api.close()
    assert fake.arrived == ["a"] and info.value.reason == "Timeout"


def _one_card_harness() -> tuple[Harness, dict]:
    h = Harness([make_node("b", gpus=1)], [])
    p = h.add_pod(make_pod("p", uid="p", gpus=1))
    h.cache.set_pod(dict(p))
    return h, p


async def test_a_binding_never_sent_frees_the_cards() -> None:
    """Nothing was written: the card is free for the next pod at once, not held for the uncertain TTL."""
    h, _ = _one_card_harness()
    h.api.fail["bind"] = ApiError(0, NOT_SENT, "POST …/binding: not sent: all 64 connections were busy")
    result = await h.extender.bind(BindingArgs("p", "default", "p", "b"))
    assert "not sent" in result["Error"]
    assert "p" not in h.cache.pods or h.cache.pods["p"].status not in ("uncertain", "assumed")
    assert h.cache.state.full_free[0] == 1


async def test_a_retry_never_sent_after_an_unknown_outcome_keeps_the_cards_held() -> None:
    """The first binding may have been written; the retry's write never left, so that is still unknown."""
    h, _ = _one_card_harness()
    h.api.fail["bind"] = ApiError(0, "Timeout", "no answer")
    await h.extender.bind(BindingArgs("p", "default", "p", "b"))
    assert h.cache.pods["p"].status == "uncertain"
    h.api.fail["bind"] = ApiError(0, NOT_SENT, "not sent")
    result = await h.extender.bind(BindingArgs("p", "default", "p", "b"))
    assert "cards stay reserved" in result["Error"]
    assert h.cache.pods["p"].status == "uncertain" and h.cache.state.full_free[0] == 0


async def test_a_retry_after_an_unknown_outcome_on_a_changed_pod_keeps_the_cards_held() -> None:
    """The pod's request changed while its first binding's outcome is unknown: that binding may stand,
    so the retry neither frees its cards nor writes another binding until the outcome is known."""
    h, _ = _one_card_harness()
    h.api.fail["bind"] = ApiError(0, "Timeout", "no answer")
    await h.extender.bind(BindingArgs("p", "default", "p", "b"))
    assert h.cache.pods["p"].status == "uncertain"
    h.cache.set_pod(make_pod("p", uid="p", gpus=1, cpu="2", rv="2001"))
    h.api.fail["bind"] = ApiError(0, NOT_SENT, "not sent")
    writes = sum(call[0] == "bind" for call in h.api.calls)
    result = await h.extender.bind(BindingArgs("p", "default", "p", "b"))
    assert "outcome is not known yet" in result["Error"]
    assert h.cache.pods["p"].status == "uncertain" and h.cache.state.full_free[0] == 0
    assert sum(call[0] == "bind" for call in h.api.calls) == writes  # no second binding written


def test_the_connections_come_from_the_settings(tmp_path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
            }
        )
    )
    assert KubeApi.from_settings(KubeSettings(kubeconfig=str(kubeconfig), api_connections=200)).call_slots == 200


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("apiConnections", 0),
        ("apiConnections", 5000),
        ("retryBackoffS", 0),  # a failing list or watch retried in a tight loop
        ("writeTimeoutS", float("nan")),
        ("writeTimeoutS", 0),
        ("listTimeoutS", 0),
        ("watchTimeoutS", -5),
        ("assumedTtlS", -1),
    ],
)
def test_kubernetes_settings_out_of_range_are_refused(key: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"kubernetes.{key}: must be"):
        merge(ExtenderSettings(), {"kubernetes": {key: value}})


def test_kubernetes_settings_in_range_are_kept() -> None:
    s = merge(ExtenderSettings(), {"kubernetes": {"apiConnections": 256, "retryBackoffS": 0.5, "writeTimeoutS": 4}})
    assert (s.kubernetes.api_connections, s.kubernetes.retry_backoff_s, s.kubernetes.write_timeout_s) == (256, 0.5, 4)


async def test_a_retry_after_a_bind_that_succeeded_is_a_success_though_the_pod_changed() -> None:
    """The first bind was written (the watch has not shown it yet) and kube-scheduler retries to the same
    node after the pod's request changed: the pod is bound there, so the answer is success, no new write."""
    h, _ = _one_card_harness()
    assert (await h.extender.bind(BindingArgs("p", "default", "p", "b"))) == {"Error": ""}
    assert h.cache.pods["p"].status == "assumed" and h.cache.pods["p"].bind_done
    h.cache.set_pod(make_pod("p", uid="p", gpus=1, cpu="2", rv="2001"))  # pending still, as the watch lags
    writes = sum(call[0] == "bind" for call in h.api.calls)
    assert (await h.extender.bind(BindingArgs("p", "default", "p", "b"))) == {"Error": ""}
    assert sum(call[0] == "bind" for call in h.api.calls) == writes
    assert h.cache.state.full_free[0] == 0
