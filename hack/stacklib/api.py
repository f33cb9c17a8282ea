"""A small asyncio client of the local API server (admin) for bulk creates, lists and watches, and the
node and namespace helpers built on it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any

from .cluster import LocalCluster
from .common import wait_for


class ApiError(RuntimeError):
    def __init__(self, status: int, body: str, what: str):
        super().__init__(f"{what}: HTTP {status}: {body[:300]}")
        self.status = status


REQUEST_TIMEOUT_S = 60.0
"""Bound on one ordinary request (connecting, waiting in the connection pool, sending, reading the
answer): a wedged API server then fails the caller's deadline (``create_nodes``' ``ready_timeout``, a
replay's creates) instead of hanging it. Far above what a local API server takes, even for a list of
thousands of pods or under bulk creates. Watches are exempt (:meth:`Api.watch`)."""


class Api:
    """aiohttp against the local API server as admin: bulk creates, lists and watches without the
    kubernetes client's per-call overhead (the benchmarks create thousands of objects).

    ``request_timeout``: seconds per ordinary request (default :data:`REQUEST_TIMEOUT_S`); past it the
    request raises ``TimeoutError`` and is not retried (it may have taken effect)."""

    def __init__(self, cluster: LocalCluster, connections: int = 32, request_timeout: float | None = None):
        self.cluster = cluster
        self.base = cluster.apiserver_url
        self.connections = connections
        self.request_timeout = request_timeout or REQUEST_TIMEOUT_S
        self._session: Any = None

    async def __aenter__(self) -> Api:
        import aiohttp

        conn = aiohttp.TCPConnector(ssl=self.cluster.ssl_context(), limit=self.connections)
        self._session = aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=self.request_timeout))
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        ok: Sequence[int] = (200, 201, 202),
    ) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        try:
            async with self._session.request(
                method, self.base + path, data=data, params=params, headers={"Content-Type": content_type}
            ) as resp:
                text = await resp.read()
        except TimeoutError as exc:
            raise TimeoutError(
                f"{method} {path}: no answer from {self.base} within {self.request_timeout:g} s (API server wedged? "
                f"{self.cluster.log_dir / 'kube-apiserver.log'})"
            ) from exc
        if resp.status not in ok:
            raise ApiError(resp.status, text.decode(errors="replace"), f"{method} {path}")
        return json.loads(text) if text else None

    async def create(self, path: str, obj: Mapping[str, Any], retries: int = 5) -> Any:
        """POST with retries on 429/5xx/connection errors (the API server sheds load under bulk creates)."""
        for attempt in range(retries + 1):
            try:
                return await self.request("POST", path, obj)
            except ApiError as exc:
                if exc.status == 409 or attempt == retries or not (exc.status == 429 or exc.status >= 500):
                    raise
            except TimeoutError:
                raise  # no answer within the request timeout: a wedged server, not load shedding
            except OSError:
                if attempt == retries:
                    raise
            await asyncio.sleep(0.2 * 2**attempt)
        return None  # pragma: no cover

    async def create_many(
        self,
        path: str,
        objs: Iterable[Mapping[str, Any]],
        parallel: int = 32,
        on_created: Callable[[Mapping[str, Any], Any], None] | None = None,
    ) -> None:
        sem = asyncio.Semaphore(parallel)

        async def one(o: Mapping[str, Any]) -> None:
            async with sem:
                r = await self.create(path, o)
                if on_created:
                    on_created(o, r)

        await asyncio.gather(*(one(o) for o in objs))

    async def list(self, path: str, params: Mapping[str, str] | None = None) -> tuple[list[dict], str]:
        """Every item (pages of 1,000) and the list's resourceVersion; with a ``limit`` of the caller's,
        its first page only (``{"limit": "1"}``: is it empty, and from where to watch)."""
        items: list[dict] = []
        one_page = "limit" in (params or {})
        p = {"limit": "1000", **(params or {})}
        while True:
            r = await self.request("GET", path, params=p)
            items.extend(r.get("items") or [])
            cont = r.get("metadata", {}).get("continue")
            if not cont or one_page:
                return items, r["metadata"]["resourceVersion"]
            p["continue"] = cont

    async def watch(
        self, path: str, resource_version: str, params: Mapping[str, str] | None = None, timeout_s: int = 3600
    ) -> AsyncIterator[tuple[str, dict]]:
        """Events of a watch until the server ends it (``timeout_s``). Not bound by the request timeout: a
        quiet watch is silent for as long as nothing changes; only connecting is."""
        import aiohttp

        p = dict(
            params or {},
            watch="1",
            resourceVersion=resource_version,
            timeoutSeconds=str(timeout_s),
            allowWatchBookmarks="true",
        )
        unbounded = aiohttp.ClientTimeout(total=None, sock_connect=self.request_timeout)
        async with self._session.get(self.base + path, params=p, timeout=unbounded) as resp:
            if resp.status != 200:
                raise ApiError(resp.status, (await resp.read()).decode(errors="replace"), f"WATCH {path}")
            buf = b""
            async for chunk in resp.content.iter_any():
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        ev = json.loads(line)
                        yield ev["type"], ev["object"]

    async def delete_collection(self, path: str, params: Mapping[str, str] | None = None) -> None:
        await self.request("DELETE", path, params=dict(params or {}, gracePeriodSeconds="0"), ok=(200, 202, 404))


NOT_READY_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})
"""Taints kube-controller-manager puts on nodes that are (or were, at creation) not Ready."""


def create_nodes(
    cluster: LocalCluster, nodes: Sequence[Mapping[str, Any]], parallel: int = 16, ready_timeout: float = 600
) -> float:
    """Create kwok nodes (status included, so capacity is there before kwok marks them Ready) and wait
    until every one is Ready and schedulable (no not-ready taint). Returns the seconds it took."""
    t0 = time.monotonic()
    names = {n["metadata"]["name"] for n in nodes}

    async def go() -> None:
        async with Api(cluster, connections=parallel) as api:

            async def one(n: Mapping[str, Any]) -> None:
                try:
                    await api.create("/api/v1/nodes", n)
                except ApiError as exc:
                    if exc.status != 409:
                        raise
                # Node create drops status on some versions: make sure capacity is set.
                await api.request(
                    "PATCH",
                    f"/api/v1/nodes/{n['metadata']['name']}/status",
                    {"status": n["status"]},
                    content_type="application/merge-patch+json",
                )

            sem = asyncio.Semaphore(parallel)

            async def guarded(n: Mapping[str, Any]) -> None:
                async with sem:
                    await one(n)

            await asyncio.gather(*(guarded(n) for n in nodes))

            deadline = time.monotonic() + ready_timeout
            while True:
                items, _ = await api.list("/api/v1/nodes")
                # Ready, and the node lifecycle controller has lifted its not-ready taint: until then
                # kube-scheduler filters the node out, and a benchmark would run on a fraction of them.
                ready = {
                    i["metadata"]["name"]
                    for i in items
                    if any(
                        c.get("type") == "Ready" and c.get("status") == "True"
                        for c in (i.get("status") or {}).get("conditions") or []
                    )
                    and not any(t.get("key") in NOT_READY_TAINTS for t in (i.get("spec") or {}).get("taints") or [])
                }
                if names <= ready:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{len(names - ready)} of {len(names)} nodes not Ready (or still tainted not-ready) "
                        f"after {ready_timeout:.0f}s (is kwok running? {cluster.log_dir / 'kwok.log'})"
                    )
                await asyncio.sleep(0.5)

    asyncio.run(go())
    return time.monotonic() - t0


def delete_nodes(cluster: LocalCluster, label_selector: str) -> None:
    async def go() -> None:
        async with Api(cluster) as api:
            await api.delete_collection("/api/v1/nodes", {"labelSelector": label_selector})

    asyncio.run(go())


def ensure_namespace(cluster: LocalCluster, namespace: str, timeout: float = 60) -> None:
    cluster.kubectl("create", "namespace", namespace, check=False)
    wait_for(
        lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", namespace, check=False).returncode == 0,
        timeout,
        f"namespace {namespace}'s default ServiceAccount",
    )
