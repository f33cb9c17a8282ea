"""A small asynchronous Kubernetes API client on aiohttp: list, watch, get, patch, bind.

Credentials come from the ``kubernetes`` package's loaders (kubeconfig with exec/token/cert auth, or
in-cluster service account with token refresh); the requests themselves run on the extender's event
loop, so the watch and the bind writes never block a thread. Watches resume from the last
resourceVersion and relist on 410 Gone (:class:`Informer`); nothing one object or one event carries
can end an informer's loop. Object names are checked (:mod:`rlsched.extender.names`) and every path
segment is URL-quoted before a request is built.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import orjson
import yarl

from .bounded_read import AnswerTooLong, read_at_most, read_capped
from .gc_pause import GcPause
from .log_throttle import EveryFewSeconds, skipped_note
from .names import check_pod_ref
from .rejections import Rejections, describe
from .settings import KubeSettings

log = logging.getLogger("rlsched.extender.kubeapi")

MAX_ANSWER_BYTES = 256 << 20
"""The largest answer read from a list page or a single call: 256 MiB. A page of 500 pods (the
informers' page size) is a few MiB even with large objects; far more is a broken or hostile peer."""
MAX_LIST_ITEMS = 300_000
"""The most objects one list reads (twice Kubernetes' documented limit of 150,000 pods per cluster):
a server that pages on and on is broken or hostile."""
MAX_LIST_PAGES = 10_000
"""The most pages one list reads (a filtered list may have short or empty pages, but not without end)."""
MAX_ERROR_BYTES = 64 << 10
"""How much of an error answer is read (its Status message is cut shorter still)."""
MAX_ERROR_MESSAGE_CHARS = 500
CREDENTIAL_REFRESH_S = 10.0
"""How often the credentials' refresh hook may run (it renews only what is near expiry)."""
MAX_WATCH_LINE_BYTES = 16 << 20
"""The longest watch event (one line) read: 16 MiB. kube-apiserver stores no object larger than etcd's
default request limit (~1.5 MiB), and an event is one object, so a line far longer is a broken stream
(a proxy, a hostile endpoint): it ends the watch as a bad event instead of filling memory."""
CALL_SLOTS = 64
"""The most calls (everything but watches) in flight at once by default, one HTTP/1.1 connection each
(``kubernetes.apiConnections``).
kube-scheduler starts a bind per pod without waiting for the previous one; with 16 a burst of binds
queued for a connection inside each write's timeout, timed out, was retried and melted down (500
pods at once: 60 bound in 4 min; with 64: all in 12 s — docs/benchmarks.md). A call waits for a slot
here, not inside aiohttp's pool, so a call that ran out of time waiting is known never to have been
sent (``ApiError.reason`` "NotSent")."""
MIN_SEND_S = 0.05
"""A call that waited for a slot is sent only with at least this much of its time left."""
NOT_SENT = "NotSent"
"""``ApiError.reason`` of a call that never reached the API server: no slot in time, or no connection
could be made. Its outcome is known (nothing was written), unlike a timeout after sending."""


class ApiError(Exception):
    """The API server answered an error (``status`` is the HTTP code; 0: not reachable).
    ``retry_after_s``: the seconds its ``Retry-After`` header asked for (429, 503), if any."""

    def __init__(self, status: int, reason: str, message: str, retry_after_s: float | None = None):
        self.status, self.reason, self.message = status, reason, message
        self.retry_after_s = retry_after_s
        super().__init__(f"{status} {reason}: {message}" if status else message)


class KubeApi:
    """Just the calls the extender makes."""

    def __init__(
        self,
        host: str,
        ssl_context: ssl.SSLContext | bool | None,
        auth: Callable[[], str | None],
        server_hostname: str | None = None,
        call_slots: int = CALL_SLOTS,
    ):
        self.host = host.rstrip("/")
        self.call_slots = call_slots
        self.ssl_context = ssl_context
        self.auth = auth
        self.server_hostname = server_hostname
        """The name the server's certificate is checked against when it is not the URL's host
        (kubeconfig ``tls-server-name``: a cluster reached by IP or through a tunnel)."""
        self.refresh: Callable[[], None] | None = None
        """Renews the credentials ``auth`` reads (the kubernetes loaders' refresh hook); run in a worker
        thread at most every CREDENTIAL_REFRESH_S, never on the event loop."""
        self._refreshed_at = -CREDENTIAL_REFRESH_S
        self._refreshing: asyncio.Future[None] | None = None
        self._refresh_errors = EveryFewSeconds(60.0)
        self._session: aiohttp.ClientSession | None = None
        self._header_cache: dict[tuple[str | None, str | None], dict[str, str]] = {}
        self._slots: asyncio.Semaphore | None = None
        self.on_slot_wait: Callable[[float], None] | None = None
        """Called with the seconds a call waited for a free slot (only calls that had to wait; a call that
        waited in vain, with its whole timeout)."""

    @classmethod
    def from_settings(cls, settings: KubeSettings) -> KubeApi:
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
                config.load_kube_config(
                    config_file=settings.kubeconfig,
                    context=settings.context,
                    client_configuration=cfg,
                    persist_config=False,
                )
                source = f"kubeconfig {settings.kubeconfig or os.environ.get('KUBECONFIG') or '~/.kube/config'}"
        except (ConfigException, OSError, TypeError, ValueError) as exc:
            where = settings.kubeconfig or "$KUBECONFIG / ~/.kube/config / in-cluster"
            raise ValueError(f"cannot load Kubernetes credentials ({where}): {exc}") from None
        if cfg.verify_ssl:
            ctx = (
                ssl.create_default_context(cafile=cfg.ssl_ca_cert) if cfg.ssl_ca_cert else ssl.create_default_context()
            )
        else:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)

        # The loaders' token refresh (an exec plugin's subprocess, a service-account token file) runs
        # inside every get_api_key_with_prefix call, on the calling thread: taken out here and run by
        # KubeApi in a worker thread, at most every CREDENTIAL_REFRESH_S.
        hook: Callable[[Any], None] | None = cfg.refresh_api_key_hook
        cfg.refresh_api_key_hook = None

        def auth() -> str | None:
            # Read directly, never through get_api_key_with_prefix: the kubeconfig loader's refresh puts
            # its hook back on the configuration, and that call would run it here, on the event loop.
            for key in ("authorization", "BearerToken"):
                value = cfg.api_key.get(key)
                if value:
                    prefix = cfg.api_key_prefix.get(key)
                    return f"{prefix} {value}" if prefix else str(value)
            return None

        https = cfg.host.startswith("https")
        api = cls(
            cfg.host,
            ctx if https else None,
            auth,
            (getattr(cfg, "tls_server_name", None) or None) if https else None,
            call_slots=settings.api_connections,
        )
        if hook is not None:
            api.refresh = lambda: hook(cfg)
        api.source = source  # type: ignore[attr-defined]
        return api

    async def __aenter__(self) -> KubeApi:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # No limit in the pool: calls are bounded by CALL_SLOTS (request()), the watches by their count.
            connector = aiohttp.TCPConnector(ssl=self.ssl_context if self.ssl_context is not None else False, limit=0)
            self._session = aiohttp.ClientSession(
                connector=connector, json_serialize=lambda o: orjson.dumps(o).decode()
            )
        return self._session

    async def _take_slot(self, method: str, path: str, timeout: float) -> tuple[asyncio.Semaphore, float]:
        """Wait (at most ``timeout`` s) for one of the CALL_SLOTS; returns the slots (to release one to)
        and the seconds waited. Raises ApiError NotSent when none came free in time."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.call_slots)
        slots = self._slots
        if not slots.locked():
            await slots.acquire()  # a free slot: taken without waiting
            return slots, 0.0
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout):
                await slots.acquire()
        except TimeoutError:
            if self.on_slot_wait is not None:
                self.on_slot_wait(timeout)
            raise ApiError(
                0, NOT_SENT, f"{method} {path}: not sent: all {self.call_slots} connections were busy for {timeout:g} s"
            ) from None
        waited = time.monotonic() - started
        if self.on_slot_wait is not None:
            self.on_slot_wait(waited)
        if timeout - waited < MIN_SEND_S:
            # Too little time left to be answered: sent, it would most likely end as an unknown outcome.
            slots.release()
            raise ApiError(
                0, NOT_SENT, f"{method} {path}: not sent: a connection came free {waited:.3g} s into its {timeout:g} s"
            )
        return slots, waited

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _refresh_credentials(self) -> None:
        """Start a credential refresh in a worker thread when one is due; the requests meanwhile use the
        current token (the loaders renew minutes before expiry)."""
        if self.refresh is None or self._refreshing is not None:
            return
        now = time.monotonic()
        if now - self._refreshed_at < CREDENTIAL_REFRESH_S:
            return
        self._refreshed_at = now
        refresh = self.refresh

        def run() -> None:
            try:
                refresh()
            except Exception as exc:  # noqa: BLE001 - an exec plugin can fail any way; the old token stays
                skipped = self._refresh_errors("refresh")
                if skipped is not None:
                    log.warning(
                        "refreshing the API credentials failed: %s%s",
                        describe(exc),
                        skipped_note(skipped),
                        extra={"event": "auth_refresh_failed"},
                    )

        def done(_: asyncio.Future[None]) -> None:
            self._refreshing = None

        self._refreshing = asyncio.get_running_loop().run_in_executor(None, run)
        self._refreshing.add_done_callback(done)

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        """The request's headers: built once per (token, content type), reused while they stay the
        same (aiohttp copies them; the token is asked for every time, so a refreshed one is used)."""
        self._refresh_credentials()
        token = self.auth()
        key = (token, content_type)
        cached = self._header_cache.get(key)
        if cached is None:
            cached = {"Accept": "application/json", "User-Agent": "rlsched-extender"}
            if token:
                cached["Authorization"] = token
            if content_type:
                cached["Content-Type"] = content_type
            if len(self._header_cache) > 8:  # tokens rotate: keep the few current ones
                self._header_cache.clear()
            self._header_cache[key] = cached
        return cached

    def _url(self, path: str) -> yarl.URL:
        """``host + path`` as a URL without re-quoting: every path here is built quoted already
        (:func:`pod_path`, ``urlencode``)."""
        return yarl.URL(self.host + path, encoded=True)

    async def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json", timeout: float = 10.0
    ) -> Any:
        """One call; raises :class:`ApiError` (status 0 when the server cannot be reached)."""
        data = orjson.dumps(body) if body is not None else None
        slots, waited = await self._take_slot(method, path, timeout)
        try:
            async with self.session().request(
                method,
                self._url(path),
                data=data,
                headers=self._headers(content_type if data is not None else None),
                timeout=aiohttp.ClientTimeout(total=max(timeout - waited, 0.001)),
                server_hostname=self.server_hostname,
            ) as resp:
                if resp.status >= 400:
                    raw_error = (await read_at_most(resp, MAX_ERROR_BYTES))[0]
                    raise _api_error(resp.status, raw_error, resp.headers.get("Retry-After"))
                raw = await read_capped(resp, MAX_ANSWER_BYTES)
                try:
                    return orjson.loads(raw) if raw else None
                except orjson.JSONDecodeError:
                    # A success with an answer that is not JSON (a proxy's page): the call may have
                    # been carried out, so it is "no usable answer" (status 0), as a timeout is.
                    raise ApiError(0, "BadAnswer", f"{method} {path}: the answer is not JSON") from None
        except AnswerTooLong as exc:
            raise ApiError(0, "TooLong", f"{method} {path}: {exc}") from None
        except TimeoutError:
            raise ApiError(0, "Timeout", f"{method} {path}: no answer from {self.host} within {timeout:g} s") from None
        except aiohttp.ClientConnectorError as exc:
            # No connection could be made (refused, DNS, TLS handshake): the request never left.
            raise ApiError(
                0, NOT_SENT, f"{method} {path}: cannot reach the API server at {self.host} (not sent): {exc}"
            ) from None
        except aiohttp.ClientError as exc:
            raise ApiError(
                0, "Unreachable", f"{method} {path}: cannot reach the API server at {self.host}: {exc}"
            ) from None
        finally:
            slots.release()

    async def list(self, path: str, timeout: float = 60.0, limit: int = 500) -> tuple[list[dict[str, Any]], str]:
        """All items of a collection (paginated) and the list's resourceVersion. A server that hands out
        the same ``continue`` token twice, more than MAX_LIST_ITEMS objects or more than MAX_LIST_PAGES
        pages fails the list."""
        items: list[dict[str, Any]] = []
        cont = ""
        tokens: set[str] = set()
        while True:
            params = {"limit": str(limit)}
            if cont:
                params["continue"] = cont
            try:
                page = await self.request("GET", _with_params(path, params), timeout=timeout)
            except ApiError as exc:
                if exc.status != 410 or not cont:
                    raise
                # The continue token expired (the list took longer than the server keeps history): as
                # client-go's pager does, one full list, unpaginated.
                log.info("%s: continue token expired; listing in one page", path, extra={"event": "list_unpaged"})
                items, cont = [], ""
                page = await self.request("GET", path, timeout=timeout)
            if type(page) is not dict:
                raise ApiError(0, "BadAnswer", f"GET {path}: the list answer is not an object")
            page_items, meta = page.get("items") or [], page.get("metadata") or {}
            if type(page_items) is not list or type(meta) is not dict:
                raise ApiError(0, "BadAnswer", f"GET {path}: the list's items or metadata are malformed")
            items.extend(page_items)
            if len(items) > MAX_LIST_ITEMS:
                raise ApiError(0, "TooLong", f"GET {path}: more than {MAX_LIST_ITEMS:,} objects")
            cont = meta.get("continue") or ""
            rv = meta.get("resourceVersion", "")
            if not isinstance(cont, str) or not isinstance(rv, str):
                raise ApiError(0, "BadAnswer", f"GET {path}: the list's continue or resourceVersion is not text")
            if not cont:
                return items, rv
            if cont in tokens:
                raise ApiError(0, "BadAnswer", f"GET {path}: the server repeated a continue token")
            if len(tokens) >= MAX_LIST_PAGES:
                raise ApiError(0, "TooLong", f"GET {path}: more than {MAX_LIST_PAGES:,} pages")
            tokens.add(cont)

    async def watch(
        self, path: str, resource_version: str, timeout_s: int, on_open: Callable[[], None] | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Watch events from ``resource_version`` until the server ends the watch; ``on_open`` is
        called once the server has accepted the watch (before any event)."""
        params = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
        }
        try:
            async with self.session().get(
                self.host + _with_params(path, params),
                headers=self._headers(),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout_s + 30),
                server_hostname=self.server_hostname,
            ) as resp:
                if resp.status >= 400:
                    raw_error = (await read_at_most(resp, MAX_ERROR_BYTES))[0]
                    raise _api_error(resp.status, raw_error, resp.headers.get("Retry-After"))
                if on_open is not None:
                    on_open()
                buf = bytearray()
                async for chunk in resp.content.iter_any():
                    buf += chunk
                    if b"\n" not in chunk:  # part of a line: wait for its end
                        if len(buf) > MAX_WATCH_LINE_BYTES:
                            raise BadWatchLine(f"watch {path}: an event longer than {MAX_WATCH_LINE_BYTES:,} bytes")
                        continue
                    # One split per chunk (a chunk often holds many events; cutting one line at a time
                    # copied the rest of the buffer for every line).
                    lines = buf.split(b"\n")
                    buf = lines.pop()
                    for line in lines:
                        if line.strip():
                            yield orjson.loads(line)
        except TimeoutError:
            raise ApiError(0, "Timeout", f"watch {path}: no data from {self.host}") from None
        except aiohttp.ClientError as exc:
            raise ApiError(0, "Unreachable", f"watch {path}: {exc}") from None

    # -- the extender's calls ---------------------------------------------------------------------
    async def get_pod(self, namespace: str, name: str, timeout: float) -> dict[str, Any]:
        """One pod; raises :class:`~rlsched.extender.names.InvalidName` before any request for a name
        no pod can have."""
        pod: dict[str, Any] = await self.request("GET", pod_path(namespace, name), timeout=timeout)
        return pod

    async def create_binding(
        self,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        timeout: float,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """POST pods/binding (UID-guarded: 409 when the pod was recreated or is already bound).

        ``annotations`` ride on the Binding: kube-apiserver copies a Binding's metadata.annotations onto
        the pod in the same update that sets ``spec.nodeName`` (BindingREST → assignPod), so the card
        assignment and the node land together, in one write, or not at all.
        """
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
        if annotations:
            meta["annotations"] = dict(annotations)
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self.request("POST", pod_path(namespace, name) + "/binding", body, timeout=timeout)


def pod_path(namespace: str, name: str) -> str:
    """``/api/v1/namespaces/NS/pods/NAME`` for valid names only, each segment quoted (no '/' survives)."""
    check_pod_ref(namespace, name)
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"


def _with_params(path: str, params: Mapping[str, str]) -> str:
    sep = "&" if "?" in path else "?"
    return path + sep + urlencode(params)


def _api_error(status: int, raw: bytes, retry_after: str | None = None) -> ApiError:
    """The error a (Status) answer says, its reason and message cut to a readable length (they go into
    log lines and into bind's answer to kube-scheduler)."""
    wait = retry_after_seconds(retry_after)
    try:
        body = orjson.loads(raw)
        return ApiError(
            status,
            str(body.get("reason", ""))[:200],
            str(body.get("message", raw[:300]))[:MAX_ERROR_MESSAGE_CHARS],
            wait,
        )
    except (orjson.JSONDecodeError, AttributeError):
        return ApiError(status, "", raw[:300].decode("utf-8", "replace"), wait)


def retry_after_seconds(value: str | None) -> float | None:
    """A ``Retry-After`` header's delay in seconds, at most RETRY_AFTER_MAX_S; None when absent or not
    a number of seconds (kube-apiserver sends whole seconds; the HTTP-date form is not followed)."""
    if value is None or len(value) > 16:
        return None
    text = value.strip()
    if not (text.isascii() and text.isdigit()):  # "²" is a digit to str.isdigit, not to float()
        return None
    return min(float(text), RETRY_AFTER_MAX_S)


WATCH_BACKOFF_MAX_S = 30.0
"""Longest pause between two tries of a failing list or watch."""
RETRY_AFTER_MAX_S = 60.0
"""The longest ``Retry-After`` followed: a longer one waits this long (readiness reports the watch
down meanwhile)."""
RELIST_WINDOW_S = 300.0
"""Lists that succeeded in this many seconds before a new one pace it: the first relist in the window
is at once, each further one comes at least the backoff of their count after the last (so a server
that forces a relist after every event or two — a 410, a broken line — is listed about twice a minute
at most, not hundreds of times a second)."""
FREE_SLICE = 1024
"""Listed objects freed between two turns of the event loop once the list is applied."""
WATCH_PROVEN_S = 10.0
"""A watch open this long without trouble ends a failure streak, events or not (a quiet cluster sends
none): a failure after it starts a new streak, so readiness does not count the quiet time as down."""
QUICK_EMPTY_WATCH_S = 1.0
"""A watch that the server ends within this time and without one event failed (it proves nothing)."""
EMPTY_WATCHES_BEFORE_RELIST = 3
"""Failed watches in a row after which the informer lists again rather than trusting its cache."""


def backoff_delay(base_s: float, failures: int, jitter: float) -> float:
    """Exponential backoff with jitter: ``base·2^(failures-1)`` capped at WATCH_BACKOFF_MAX_S, times
    0.5..1.0 (``jitter`` in [0, 1)) so that many extenders restarted together do not retry in step."""
    exp = min(max(failures - 1, 0), 16)
    return min(base_s * (2.0**exp), WATCH_BACKOFF_MAX_S) * (0.5 + 0.5 * jitter)


class Informer:
    """List once, then watch; resume from the last resourceVersion, relist on 410 Gone.

    Per-object failures while applying an event are the cache's to absorb (logged once, counted); an
    event that is not an object is skipped the same way. Anything else that goes wrong — the API
    server unreachable, a broken stream, a bug — ends only the current list or watch: the loop waits
    (exponential backoff with jitter), relists when it cannot trust its resourceVersion any more, and
    goes on. ``up``/``down_since``/``last_error`` tell /readyz and /status how it is doing.

    ``replace`` applies a list. It may return an iterable that applies it step by step: the informer
    yields the event loop between two steps, so that a long list does not hold up the requests.
    """

    def __init__(
        self,
        api: KubeApi,
        resource: str,
        path: str,
        replace: Callable[[list[dict[str, Any]]], Iterable[None] | None],
        apply: Callable[[str, dict[str, Any]], None],
        settings: KubeSettings,
        metrics: Any = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rejections: Rejections | None = None,
        jitter: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.monotonic,
        gc_pause: GcPause | None = None,
    ):
        self.api, self.resource, self.path = api, resource, path
        self.gc_pause = gc_pause
        """Held while a list is read and applied (one per process, shared by its informers); None: the
        collector runs as usual."""
        self.accepted_at: float | None = None
        """When the open watch was accepted (None when none is open, or it failed)."""
        self.listed_at: deque[float] = deque()
        """When the lists of the last RELIST_WINDOW_S succeeded (monotonic): they pace the next one."""
        self.replace, self.apply = replace, apply
        self.settings, self.metrics, self.sleep = settings, metrics, sleep
        self.rejections = rejections or Rejections()
        self.jitter, self.clock = jitter, clock
        self.kind = {"pods": "Pod", "nodes": "Node"}.get(resource, resource)
        self.resource_version: str | None = None
        self.up = False
        """The last list or watch request succeeded (and no failure since)."""
        self.down_since: float | None = clock()
        """Monotonic time since when it has not been up (None while up); set at creation: not listed yet."""
        self.last_error: str | None = None
        """The current failure; None while up (cleared when the list or watch works again)."""
        self.last_error_at: float | None = None
        self.resolved: dict[str, Any] | None = None
        """The last failure that was resolved: {"error", "at", "resolvedAt"} (wall-clock seconds)."""
        self.failures = 0
        """Consecutive failures (the backoff's exponent); reset by an event or a watch that ran to its
        end — not by a list or a watch merely accepted, so a server that lists fine but drops every
        watch (or answers every watch 410) still meets a growing backoff."""
        self.gone_in_a_row = 0
        """410 answers since the last watch event: the first relists at once, the next ones back off
        (a list slower than the server's history answers every watch 410; relisting at once was a
        hot loop of full lists)."""

    def down_for(self) -> float:
        """Seconds since the informer was last up (0 while up)."""
        return 0.0 if self.down_since is None else self.clock() - self.down_since

    def status(self) -> dict[str, Any]:
        """For /status ``watches.<resource>``."""
        return {
            "resourceVersion": self.resource_version,
            "up": self.up,
            "downSeconds": None if self.up else round(self.down_for(), 3),
            "lastError": self.last_error,
            "lastErrorAt": self.last_error_at,
            "resolved": self.resolved,
            "consecutiveFailures": self.failures,
        }

    async def sync(self) -> None:
        """The initial (or a re-) list; raises ApiError. Paced by the lists before it (RELIST_WINDOW_S)."""
        await self._pace_list()
        with self.gc_pause or contextlib.nullcontext():
            items, rv = await self.api.list(self.path, timeout=self.settings.list_timeout_s)
            steps = self.replace(items)
            if steps is not None:  # applied in slices: requests are served between them
                for _ in steps:
                    await asyncio.sleep(0)
            count = len(items)
            while items:  # freed a slice at a time too: 20,000 pods' objects at once took ~0.1 s
                del items[-FREE_SLICE:]
                await asyncio.sleep(0)
        self.listed_at.append(self.clock())
        self.resource_version = rv
        self._opened()
        log.info(
            "listed %d %s at resourceVersion %s",
            count,
            self.resource,
            rv,
            extra={"event": "listed", "resource": self.resource, "count": count},
        )

    async def _pace_list(self) -> None:
        """Space the lists out when others succeeded lately: the first relist in RELIST_WINDOW_S is at
        once; each further one comes at least the backoff of their count after the last (time already
        spent in a failure's backoff counts). A watch that delivers an event resets ``failures``, so
        this is what stops a server that breaks every watch after one event from being listed in a
        loop."""
        now = self.clock()
        while self.listed_at and now - self.listed_at[0] > RELIST_WINDOW_S:
            self.listed_at.popleft()
        if len(self.listed_at) < 2:
            return
        recent = len(self.listed_at) - 1
        wait = backoff_delay(self.settings.retry_backoff_s, recent, self.jitter()) - (now - self.listed_at[-1])
        if wait > 0:
            log.info(
                "%s: %d lists in the last %.0f s; the next in %.1f s",
                self.resource,
                len(self.listed_at),
                RELIST_WINDOW_S,
                wait,
                extra={"event": "relist_paced", "resource": self.resource},
            )
            await self.sleep(wait)

    async def run(self) -> None:
        """Forever: watch, resume, relist when needed. Errors are logged, counted and retried; only
        cancellation ends it."""
        while True:
            self.accepted_at = None  # set again when this round's watch is accepted
            try:
                if self.resource_version is None:
                    await self.sync()
                started, events = self.clock(), 0
                async for event in self.api.watch(
                    self.path, self.resource_version or "", self.settings.watch_timeout_s, on_open=self._accepted
                ):
                    events += 1
                    self._handle(event)  # raises for an ERROR event: that one does not count as working
                    self.failures = self.gone_in_a_row = 0
                    self._opened()
                if not events and self.clock() - started < QUICK_EMPTY_WATCH_S:
                    # A server that ends every watch at once: nothing is watched, whatever it answers.
                    relist = self.failures + 1 >= EMPTY_WATCHES_BEFORE_RELIST
                    await self._failed("empty", "the watch ended at once without an event", relist=relist)
                    continue
                self.failures = self.gone_in_a_row = 0
                self._opened()
                self._restart("timeout")
            except asyncio.CancelledError:
                raise
            except Gone:
                await self._gone("the watch's resourceVersion expired (410 Gone)")
            except ApiError as exc:
                if exc.status == 410:
                    await self._gone(str(exc))
                    continue
                await self._failed("error", str(exc), relist=False, retry_after_s=exc.retry_after_s)
            except Exception as exc:  # noqa: BLE001 - a broken stream or a bug: relist, never die
                bad = isinstance(exc, (orjson.JSONDecodeError, BadWatchLine))
                await self._failed("bad-event" if bad else "unexpected", describe(exc), relist=True)

    async def _gone(self, message: str) -> None:
        """Relist: at once the first time since the last event, else after the backoff, as a failure
        (readiness and /status see it)."""
        self.gone_in_a_row += 1
        if self.gone_in_a_row > 1:
            await self._failed("gone", f"{message}, {self.gone_in_a_row} times without an event", relist=True)
            return
        self.resource_version = None
        self._restart("gone")
        log.info("%s: %s; relisting", self.resource, message, extra={"event": "relist", "resource": self.resource})

    def _handle(self, event: Any) -> None:
        if type(event) is not dict and not isinstance(event, Mapping):
            self.rejections.reject(self.kind, None, TypeError(f"watch event is {type(event).__name__}, not an object"))
            return
        kind = event.get("type")
        obj = event.get("object")
        if type(obj) is not dict and not isinstance(obj, Mapping):
            self.rejections.reject(self.kind, None, TypeError(f"{kind} event without an object"))
            return
        if kind == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise Gone()
            raise ApiError(
                code if isinstance(code, int) and not isinstance(code, bool) else 500,
                str(obj.get("reason", ""))[:200],
                str(obj.get("message", "watch error"))[:500],
            )
        meta = obj.get("metadata")
        rv = meta.get("resourceVersion") if type(meta) is dict or isinstance(meta, Mapping) else None
        rv = rv if isinstance(rv, str) else None
        if kind == "BOOKMARK":
            if rv:
                self.resource_version = rv
            return
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            try:
                self.apply(kind, obj)  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001 - the cache absorbs its own; this is the last fence
                self.rejections.reject(self.kind, obj, exc)
        if rv:
            self.resource_version = rv

    def _accepted(self) -> None:
        """The server accepted a watch. Up; but after failures, only an event, a watch that runs to its
        end or a list clears them: a server that accepts every watch and breaks it at once is down
        since the first failure, however often it accepts."""
        self.accepted_at = self.clock()
        if self.failures == 0:
            self._opened()
        else:
            self.up = True

    def _opened(self) -> None:
        """The list or watch works (again): clear the failure."""
        if self.up and self.down_since is None:
            return
        if self.last_error is not None:
            self.resolved = {"error": self.last_error, "at": self.last_error_at, "resolvedAt": round(time.time(), 3)}
            log.info(
                "%s watch recovered after %.1f s (%s)",
                self.resource,
                self.down_for(),
                self.last_error,
                extra={"event": "watch_recovered", "resource": self.resource},
            )
        self.up, self.down_since, self.last_error, self.last_error_at = True, None, None, None

    async def _failed(self, reason: str, message: str, relist: bool, retry_after_s: float | None = None) -> None:
        """Down since the first failure in a row; wait the backoff (or the server's Retry-After, when
        longer) before the next try."""
        if self.accepted_at is not None and self.clock() - self.accepted_at >= WATCH_PROVEN_S:
            self.failures, self.down_since = 0, None  # the watch worked for a while: a new streak
        self.accepted_at = None
        self.failures += 1
        self.up = False
        if self.down_since is None:
            self.down_since = self.clock()
        self.last_error, self.last_error_at = message, round(time.time(), 3)
        if relist:
            self.resource_version = None
        self._restart(reason)
        delay = backoff_delay(self.settings.retry_backoff_s, self.failures, self.jitter())
        if retry_after_s is not None:
            delay = max(delay, retry_after_s)
        log.warning(
            "%s watch failed: %s; %s in %.1f s",
            self.resource,
            message,
            "relisting" if relist else "retrying",
            delay,
            extra={"event": "watch_failed", "resource": self.resource, "reason": reason},
        )
        await self.sleep(delay)

    def _restart(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.watch_restarts.labels(self.resource, reason).inc()


class Gone(Exception):
    """The watch's resourceVersion is too old (410): relist."""


class BadWatchLine(ValueError):
    """A watch line longer than :data:`MAX_WATCH_LINE_BYTES`: the stream is broken (relist)."""


PODS_PATH = "/api/v1/pods?" + urlencode({"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"})
"""Like kube-scheduler's informer: terminal pods hold nothing (a pod turning terminal arrives as DELETED)."""
NODES_PATH = "/api/v1/nodes"
