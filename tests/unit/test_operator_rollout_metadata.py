"""A model URL never reaches a cloud's instance metadata, in whatever form its address is written."""

from __future__ import annotations

import socket

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from rlsched.operator.rollout import ModelFetcher, SourceError

METADATA_LITERALS = [
    "[::ffff:169.254.169.254]",  # IPv4-mapped, dotted
    "[::ffff:a9fe:a9fe]",  # IPv4-mapped, hex
    "[::169.254.169.254]",  # IPv4-compatible
    "[2002:a9fe:a9fe::1]",  # 6to4
    "[64:ff9b::a9fe:a9fe]",  # NAT64
    "[fd00:ec2::254]",  # AWS's IPv6 instance metadata
    "[fd00:ec2::23]",  # EKS Pod Identity's IPv6 credentials endpoint
    "[fd20:ce::254]",  # GCP's IPv6 metadata server
    "[64:ff9b:1::a9fe:a9fe]",  # local-use NAT64 (RFC 8215)
    "[::ffff:0:a9fe:a9fe]",  # IPv4-translated (SIIT)
    "100.100.100.200",  # Alibaba Cloud's
]


@pytest.mark.parametrize("host", METADATA_LITERALS)
async def test_a_model_url_naming_instance_metadata_in_another_form_is_refused(host: str) -> None:
    """Only 169.254.0.0/16 and fe80::/10 were refused, as written: ``[::ffff:169.254.169.254]`` passed
    the check and aiohttp dialled it as 169.254.169.254."""
    with pytest.raises(SourceError) as err:
        await ModelFetcher(None, timeout_s=1.0)._url(f"http://{host}/latest/meta-data/")
    assert err.value.reason == "ModelSourceRefused" and not err.value.temporary


@pytest.mark.parametrize("answer", ["::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe", "fd00:ec2::254"])
async def test_a_name_resolving_to_instance_metadata_in_another_form_is_refused(
    monkeypatch: pytest.MonkeyPatch, answer: str
) -> None:
    """The resolver dropped link-local answers as written: an AAAA answer with a mapped address passed."""

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[dict]:
        return [{"hostname": host, "host": answer, "port": port, "family": socket.AF_INET6, "proto": 0, "flags": 0}]

    monkeypatch.setattr(aiohttp.ThreadedResolver, "resolve", resolve)
    with pytest.raises(SourceError) as err:
        await ModelFetcher(None, timeout_s=1.0)._url("http://models.example/m.npz")
    assert err.value.reason == "ModelSourceRefused" and not err.value.temporary


@pytest.mark.parametrize(
    "host, reached",
    [
        ("169.254.169.254", "169.254.169.254"),
        ("[fe80::1%eth0]", "fe80::1"),
        ("::ffff:a9fe:a9fe", "169.254.169.254"),
        ("2001:0:4136:e378:8000:63bf:5601:5601", "169.254.169.254"),  # Teredo, client obfuscated
        ("10.0.0.1", None),
        ("64:ff9b:1::a00:1", None),  # local-use NAT64 to a private address: a model server may live there
        ("::ffff:10.0.0.1", None),
        ("2002:0a00:0001::1", None),
        ("::1", None),
        ("fd00:ec2::253", None),
        ("models.example", None),
    ],
)
def test_metadata_address_names_what_the_connection_reaches(host: str, reached: str | None) -> None:
    from rlsched.operator.rollout import metadata_address

    got = metadata_address(host)
    assert (str(got).split("%")[0] if got is not None else None) == reached


async def test_a_mapped_address_that_is_not_metadata_is_still_fetched() -> None:
    """Private and loopback addresses stay allowed (model servers live there), mapped or not."""

    async def handle(request: web.Request) -> web.Response:
        return web.Response(body=b"MODEL")

    app = web.Application()
    app.router.add_get("/m.npz", handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        data = await ModelFetcher(None, timeout_s=5.0)._url(f"http://[::ffff:127.0.0.1]:{server.port}/m.npz")
    finally:
        await server.close()
    assert data == b"MODEL"
