"""The whole service on real sockets with a fake API: start-up rebuilds assignments, the watch feeds
the cache, binds survive a restart, shutdown is clean."""

from __future__ import annotations

import asyncio
import copy

import aiohttp
import orjson
import pytest

from rlsched.extender.kubeapi import ApiError
from rlsched.extender.objects import assignment_annotations
from rlsched.extender.server import StartupError, serve
from rlsched.extender.settings import AuthSettings, ExtenderSettings, GpuConventions, ServerSettings
from rlsched.extender.testing import FakeKubeApi, make_node, make_pod, start_service

GPU = GpuConventions()


def settings() -> ExtenderSettings:
    # auth.mode none: the fake API answers no TokenReview (tests/unit/test_extender_auth.py covers auth)
    return ExtenderSettings(
        server=ServerSettings(port=0, status_port=0, status_host="127.0.0.1"), auth=AuthSettings(mode="none")
    )


async def start(api: FakeKubeApi):
    return await start_service(api, settings())


async def test_restart_rebuilds_assignments_and_serves() -> None:
    nodes = [make_node("g0", gpus=4), make_node("g1", gpus=4)]
    bound = make_pod("old", gpus=2, node="g0", uid="old", annotations=assignment_annotations(GPU, "g0", (1, 2), 1000))
    share = make_pod(
        "share", gpu_milli=600, node="g1", uid="share", annotations=assignment_annotations(GPU, "g1", (3,), 600)
    )
    api = FakeKubeApi(nodes, [bound, share])
    service, stop, task = await start(api)
    try:
        state = service.cache.state
        assert state.card_free[state.index["g0"]].tolist() == [1000, 0, 0, 1000]
        assert state.card_free[state.index["g1"]].tolist() == [1000, 1000, 1000, 400]
        host, port = service.addresses["verbs"]
        shost, sport = service.addresses["status"]
        async with aiohttp.ClientSession() as http:
            r = await http.get(f"http://{shost}:{sport}/readyz")
            assert r.status == 200
            pod = make_pod("new", gpus=3, uid="new")
            api.pods[("default", "new")] = copy.deepcopy(pod)
            r = await http.post(
                f"http://{host}:{port}/filter", data=orjson.dumps({"Pod": pod, "NodeNames": ["g0", "g1"]})
            )
            body = await r.json()
            assert body["NodeNames"] == ["g1"] and body["FailedNodes"] == {}  # reasons only when nothing fits
            r = await http.post(
                f"http://{host}:{port}/bind",
                data=orjson.dumps({"PodName": "new", "PodNamespace": "default", "PodUID": "new", "Node": "g1"}),
            )
            assert await r.json() == {"Error": ""}
            for _ in range(100):  # the fake API's watch delivers the bound pod
                if service.cache.pods["new"].status == "bound":
                    break
                await asyncio.sleep(0.01)
            assert service.cache.pods["new"].status == "bound"
            # the pod finishes: the watch releases its cards
            done = copy.deepcopy(api.pods[("default", "new")])
            done["status"]["phase"] = "Succeeded"
            api.emit({"type": "MODIFIED", "object": done})
            for _ in range(100):
                if "new" not in service.cache.pods:
                    break
                await asyncio.sleep(0.01)
            assert "new" not in service.cache.pods
            metrics = await (await http.get(f"http://{shost}:{sport}/metrics")).text()
            assert "rlsched_extender_cache_nodes 2.0" in metrics
            # 8 cards; "old" holds 2 whole cards and "share" 600 milli ("new" has finished)
            assert "rlsched_extender_gpu_milli_capacity 8000.0" in metrics
            assert "rlsched_extender_gpu_milli_allocated 2600.0" in metrics
            status = await (await http.get(f"http://{shost}:{sport}/status")).json()
            assert set(status["watches"]) == {"nodes", "pods"}
        # a restart sees what the binds wrote
        stop.set()
        assert await task == 0
        new_pod = api.pods[("default", "new")]
        assert new_pod["metadata"]["annotations"]["rlsched.io/gpu-cards"] == "0,1,2"
        api2 = FakeKubeApi(nodes, list(api.pods.values()))
        service2, stop2, task2 = await start(api2)
        s2 = service2.cache.state
        assert s2.card_free[s2.index["g1"]].tolist() == [0, 0, 0, 400]
        stop2.set()
        assert await task2 == 0
    finally:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)


async def test_unreachable_api_stops_startup() -> None:
    api = FakeKubeApi([make_node("g0")])
    api.fail["list"] = ApiError(0, "Unreachable", "cannot reach the API server at https://10.0.0.1:6443")
    with pytest.raises(StartupError, match="cannot list nodes: cannot reach the API server.*is the API server running"):
        await serve(settings(), api=api, stop=asyncio.Event())
    api.fail["list"] = ApiError(403, "Forbidden", "nodes is forbidden")
    with pytest.raises(StartupError, match="RBAC"):
        await serve(settings(), api=api, stop=asyncio.Event())
