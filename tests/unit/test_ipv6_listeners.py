"""``listenAddress: "::"``: on a cluster whose pods' first IP is IPv6 the kubelet probes that IP, so
the listeners it and the Service reach (the extender's status port, the operator's health and
metrics ports) must hold an IPv6 address; they bound 0.0.0.0 only, and such clusters were not
supported. The chart renders the address into each component's settings, and each component
listens there."""

from __future__ import annotations

import asyncio
import socket
import subprocess
from pathlib import Path

import aiohttp
import pytest
import yaml
from test_chart_sync import CHART, HELM, find, needs_helm, pod_spec, render

from rlsched.extender.settings import ExtenderSettings, ServerSettings
from rlsched.extender.testing import FakeKubeApi, make_node, start_service

IPV6 = {"listenAddress": "::", "operator": {"metricsPort": 9102}}


@needs_helm
def test_the_chart_renders_the_address_into_every_listener(tmp_path: Path) -> None:
    from rlsched.extender.settings import load_settings as extender_settings
    from rlsched.operator.settings import load_settings as operator_settings

    objs = render(tmp_path, IPV6)
    (tmp_path / "extender.yaml").write_text(find(objs, "ConfigMap", "-config")["data"]["extender.yaml"])
    ext = extender_settings(tmp_path / "extender.yaml")
    assert (ext.server.host, ext.server.status_host) == ("127.0.0.1", "::")  # the verbs stay on loopback
    (tmp_path / "operator.yaml").write_text(find(objs, "ConfigMap", "-operator")["data"]["operator.yaml"])
    op = operator_settings(tmp_path / "operator.yaml", {})
    health = pod_spec(objs, "operator")["containers"][0]["ports"][0]["containerPort"]
    assert op.liveness_endpoint == f"http://[::]:{health}/healthz"
    assert op.metrics_endpoint == "[::]:9102"


@needs_helm
@pytest.mark.parametrize("address", ["127.0.0.1", "::1", "10.0.0.1", "[::]", ""])
def test_the_chart_refuses_any_other_address(tmp_path: Path, address: str) -> None:
    """A specific address would leave the Service and the probes outside; loopback would answer nobody."""
    done = subprocess.run(
        [HELM, "template", "r", str(CHART), "--set-string", f"listenAddress={address}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and f'listenAddress="{address}": use "0.0.0.0" (IPv4) or "::"' in done.stderr


@needs_helm
def test_the_default_is_ipv4(tmp_path: Path) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["listenAddress"] == "0.0.0.0"


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


needs_ipv6 = pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this host")


@needs_ipv6
async def test_the_extender_status_port_answers_on_ipv6() -> None:
    settings = ExtenderSettings(server=ServerSettings(port=0, status_port=0, status_host="::"))
    service, stop, task = await start_service(FakeKubeApi([make_node("a")], []), settings)
    try:
        _, port = service.addresses["status"]
        async with aiohttp.ClientSession() as http:
            for path in ("/healthz", "/readyz"):  # the kubelet's probes: always open
                async with http.get(f"http://[::1]:{port}{path}") as r:
                    assert r.status == 200, path
            async with http.get(f"http://[::1]:{port}/status") as r:
                assert r.status == 401  # auth as on any address
    finally:
        stop.set()
        await task


@needs_ipv6
async def test_the_operator_metrics_port_answers_on_ipv6() -> None:
    from prometheus_client import CollectorRegistry, Counter

    from rlsched.operator.metrics import serve

    with socket.socket(socket.AF_INET6) as s:  # a free port
        s.bind(("::1", 0))
        port = s.getsockname()[1]
    registry = CollectorRegistry()
    Counter("rlsched_test_probe", "a probe", registry=registry).inc()
    task = asyncio.create_task(serve(registry, f"[::]:{port}"))
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(100):
                try:
                    async with http.get(f"http://[::1]:{port}/metrics") as r:
                        assert r.status == 200 and "rlsched_test_probe_total 1.0" in await r.text()
                        break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.02)
            else:
                pytest.fail("the metrics listener never answered on [::1]")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
