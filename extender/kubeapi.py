"""A small asynchronous Kubernetes API client on aiohttp: list, watch, get, patch, bind.

Credentials come from the ``kubernetes`` package's loaders (kubeconfig with exec/token/cert auth, or
in-cluster service account with token refresh); the requests themselves run on the extender's event
loop, so the watch and the bind writes never block a thread. Watches resume from the last
resourceVersion and relist on 410 Gone (:class:`Informer`).
"""
from __future__ import annotations

import asyncio
import logging
import os
import ssl
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping
from urllib.parse import quote, urlencode

import aiohttp
import orjson

from .settings import KubeSettings

log = logging.getLogger("rlsched.extender.kubeapi")


class ApiError(Exception):
    """The API server answered an error (``status`` is the HTTP code; 0: not reachable)."""

    def __init__(self, status: int, reason: str, message: str):
        self.status, self.reason, self.message = status, reason, message
        super().__init__(f"{status} {reason}: {message}" if status else message)


class KubeApi:
    """Just the calls the extender makes."""

    def __init__(self, host: str, ssl_context: ssl.SSLContext | bool | None, auth: Callable[[], str | None]):
        self.host = host.rstrip("/")
        self.ssl_context = ssl_context
        self.auth = auth
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_settings(cls, settings: KubeSettings) -> "KubeApi":
        """Credentials from the kubeconfig / in-cluster service account (raises ConfigError-like
        ValueError with the cause when none can be loaded)."""
        from kubernetes import client, config  # start-up only
        from kubernetes.config.config_exception import ConfigException

        cfg = client.Configuration()
        try:
            if settings.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
                config.load_incluster_config(client_configuration=cfg)
                source = "in-cluster service account"
            else:
                config.load_kube_config(config_file=settings.kubeconfig, context=settings.context,
                                        client_configuration=cfg, persist_config=False)
                source = f"kubeconfig {settings.kubeconfig or os.environ.get('KUBECONFIG') or '~/.kube/config'}"
        except (ConfigException, OSError, TypeError, ValueError) as exc:
            raise ValueError(f"cannot load Kubernetes credentials ({settings.kubeconfig or '$KUBECONFIG / ~/.kube/config / in-cluster'}): {exc}") from None
        if cfg.verify_ssl:
            ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert) if cfg.ssl_ca_cert else ssl.create_default_context()
        else:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)

        def auth() -> str | None:
            return cfg.get_api_key_with_prefix("authorization") or cfg.get_api_key_with_prefix("BearerToken")

        api = cls(cfg.host, ctx if cfg.host.startswith("https") else None, auth)
        api.source = source  # type: ignore[attr-defined]
        return api

    async def __aenter__(self) -> "KubeApi":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # HTTP/1.1: one connection per request in flight. kube-scheduler starts a bind per pod without
            # waiting for the previous one; with 16 connections a burst of binds queued for a
            # connection inside each write's 2 s timeout, timed out, was retried and melted down
            # (500 pods at once: 60 bound in 4 min; with 64: all in 12 s — docs/benchmarks.md).
            connector = aiohttp.TCPConnector(ssl=self.ssl_context if self.ssl_context is not None else False, limit=64)
            self._session = aiohttp.ClientSession(connector=connector, json_serialize=lambda o: orjson.dumps(o).decode())
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "rlsched-extender"}
        token = self.auth()
        if token:
            headers["Authorization"] = token
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    async def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                      timeout: float = 10.0) -> Any:
        """One call; raises :class:`ApiError` (status 0 when the server cannot be reached)."""
        data = orjson.dumps(body) if body is not None else None
        try:
            async with self.session().request(method, self.host + path, data=data,
                                              headers=self._headers(content_type if data is not None else None),
                                              timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                raw = await resp.read()
                if resp.status >= 400:
                    raise _api_error(resp.status, raw)
                return orjson.loads(raw) if raw else None
        except asyncio.TimeoutError:
            raise ApiError(0, "Timeout", f"{method} {path}: no answer from {self.host} within {timeout:g} s") from None
        except aiohttp.ClientError as exc:
            raise ApiError(0, "Unreachable", f"{method} {path}: cannot reach the API server at {self.host}: {exc}") from None

    async def list(self, path: str, timeout: float = 60.0, limit: int = 500) -> tuple[list[dict], str]:
        """All items of a collection (paginated) and the list's resourceVersion."""
        items: list[dict] = []
        cont = ""
        while True:
            params = {"limit": str(limit)}
            if cont:
                params["continue"] = cont
            page = await self.request("GET", _with_params(path, params), timeout=timeout)
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            cont = meta.get("continue") or ""
            if not cont:
                return items, meta.get("resourceVersion", "")

    async def watch(self, path: str, resource_version: str, timeout_s: int) -> AsyncIterator[dict]:
        """Watch events from ``resource_version`` until the server ends the watch."""
        params = {"watch": "1", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
                  "timeoutSeconds": str(timeout_s)}
        try:
            async with self.session().get(self.host + _with_params(path, params), headers=self._headers(),
                                          timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout_s + 30)) as resp:
                if resp.status >= 400:
                    raise _api_error(resp.status, await resp.read())
                buf = b""
                async for chunk in resp.content.iter_any():
                    buf += chunk
                    while True:
                        nl = buf.find(b"\n")
                        if nl < 0:
                            break
                        line, buf = buf[:nl], buf[nl + 1:]
                        if line.strip():
                            yield orjson.loads(line)
        except asyncio.TimeoutError:
            raise ApiError(0, "Timeout", f"watch {path}: no data from {self.host}") from None
        except aiohttp.ClientError as exc:
            raise ApiError(0, "Unreachable", f"watch {path}: {exc}") from None

    # -- the extender's calls ---------------------------------------------------------------------
    async def get_pod(self, namespace: str, name: str, timeout: float) -> dict:
        return await self.request("GET", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}", timeout=timeout)

    async def create_binding(self, namespace: str, name: str, uid: str, node: str, timeout: float,
                             annotations: Mapping[str, str] | None = None) -> None:
        """POST pods/binding (UID-guarded: 409 when the pod was recreated or is already bound).

        ``annotations`` ride on the Binding: kube-apiserver copies a Binding's metadata.annotations onto
        the pod in the same update that sets ``spec.nodeName`` (BindingREST → assignPod), so the card
        assignment and the node land together, in one write, or not at all.
        """
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
        if annotations:
            meta["annotations"] = dict(annotations)
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        await self.request("POST", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}/binding", body,
                           timeout=timeout)


def _with_params(path: str, params: Mapping[str, str]) -> str:
    sep = "&" if "?" in path else "?"
    return path + sep + urlencode(params)


def _api_error(status: int, raw: bytes) -> ApiError:
    try:
        body = orjson.loads(raw)
        return ApiError(status, str(body.get("reason", "")), str(body.get("message", raw[:300])))
    except (orjson.JSONDecodeError, AttributeError):
        return ApiError(status, "", raw[:300].decode("utf-8", "replace"))


class Informer:
    """List once, then watch; resume from the last resourceVersion, relist on 410 Gone."""

    def __init__(self, api: KubeApi, resource: str, path: str, replace: Callable[[list[dict]], None],
                 apply: Callable[[str, dict], None], settings: KubeSettings, metrics: Any = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        self.api, self.resource, self.path = api, resource, path
        self.replace, self.apply = replace, apply
        self.settings, self.metrics, self.sleep = settings, metrics, sleep
        self.resource_version: str | None = None
        self.last_error: str | None = None

    async def sync(self) -> None:
        """The initial (or a re-) list; raises ApiError."""
        items, rv = await self.api.list(self.path, timeout=self.settings.list_timeout_s)
        self.replace(items)
        self.resource_version = rv
        log.info("listed %d %s at resourceVersion %s", len(items), self.resource, rv,
                 extra={"event": "listed", "resource": self.resource, "count": len(items)})

    async def run(self) -> None:
        """Forever: watch, resume, relist when needed. Errors are logged, counted and retried."""
        backoff = self.settings.retry_backoff_s
        while True:
            try:
                if self.resource_version is None:
                    await self.sync()
                async for event in self.api.watch(self.path, self.resource_version or "", self.settings.watch_timeout_s):
                    self._handle(event)
                backoff = self.settings.retry_backoff_s
                self._restart("timeout")
            except Gone:
                self.resource_version = None
                self._restart("gone")
                log.info("%s watch expired (410 Gone); relisting", self.resource, extra={"event": "relist", "resource": self.resource})
            except ApiError as exc:
                if exc.status == 410:
                    self.resource_version = None
                    self._restart("gone")
                    continue
                self.last_error = str(exc)
                self._restart("error")
                log.warning("%s watch failed: %s; retrying in %.0f s", self.resource, exc, backoff,
                            extra={"event": "watch_failed", "resource": self.resource})
                await self.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
            except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
                self.last_error = f"bad watch event: {exc}"
                self.resource_version = None
                self._restart("bad-event")
                log.warning("%s watch sent something unreadable (%s); relisting", self.resource, exc,
                            extra={"event": "watch_failed", "resource": self.resource})
                await self.sleep(backoff)

    def _handle(self, event: dict) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone()
            raise ApiError(int(obj.get("code") or 500), str(obj.get("reason", "")), str(obj.get("message", "watch error")))
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            if rv:
                self.resource_version = rv
            return
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self.apply(kind, obj)
        if rv:
            self.resource_version = rv

    def _restart(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.watch_restarts.labels(self.resource, reason).inc()


class Gone(Exception):
    """The watch's resourceVersion is too old (410): relist."""


PODS_PATH = "/api/v1/pods?" + urlencode({"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"})
"""Like kube-scheduler's informer: terminal pods hold nothing (a pod turning terminal arrives as DELETED)."""
NODES_PATH = "/api/v1/nodes"
