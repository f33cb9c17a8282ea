"""Putting the extender together and running it.

Start-up order, each step failing with a message that says what to fix:

1. the policy (policy file, model; a bad one stops start-up when ``strictModel``);
2. API credentials (kubeconfig / in-cluster);
3. the status listener (/healthz answers from here on; /readyz says "starting"), with the bearer-token
   checks of :mod:`rlsched.extender.auth` unless ``auth.mode`` is ``none``; HTTPS with
   ``server.statusTls`` (:mod:`rlsched.extender.status_tls`: its certificate is re-read when it changes);
4. the initial list of nodes and pods — the cache, with the card assignments recorded on bound pods,
   is complete before anything is decided (an unreachable API server stops start-up);
5. ``gc.freeze()``: the start-up objects leave the collector's view;
6. the verb listener (HTTPS with client certificates when ``server.tls`` is set) and the background
   tasks (watches, policy/model polling, Prometheus load, expiry of uncertain reservations) in the
   verb app's ``cleanup_ctx``; /readyz turns ready.

SIGTERM/SIGINT stop the listeners (in-flight requests get ``shutdown_timeout_s``) and cancel the tasks.
Both listeners drop clients that are slow to send their headers and cap open connections
(:mod:`rlsched.extender.listener`).

Every background task runs under a supervisor that restarts it (exponential backoff with jitter,
logged) whenever it ends, for whatever reason but cancellation: a watch can fail, it cannot stay down.
/readyz reports a watch only when it has been down longer than :data:`WATCH_DOWN_NOT_READY_S`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import signal
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web
from prometheus_client.metrics_core import Metric

from .app import Health, make_app, make_status_app
from .auth import Authenticator
from .binder import Binder
from .cache import ClusterCache
from .decision_ring import DecisionRing
from .gc_pause import GcPause
from .kubeapi import NODES_PATH, PODS_PATH, ApiError, Informer, KubeApi, backoff_delay
from .listener import ConnectionGuard, ConnectionMetrics, GuardedSite
from .log_throttle import HttpServerLog
from .metrics import BAD_HTTP_VERB, Metrics, gauge
from .policy import PolicyEngine, load_model
from .prometheus import LoadPoller
from .rejections import Rejections, describe, identity
from .settings import ConfigError, ExtenderSettings, ServerSettings, TlsSettings, check_complete
from .status_tls import StatusTls, no_passphrase
from .verbs import Extender

log = logging.getLogger("rlsched.extender")

WATCH_DOWN_NOT_READY_S = 60.0
"""A watch that has been failing this long makes /readyz 503: the cache may be that stale. Shorter
outages (an API server restart, a dropped connection) are retried without flapping readiness."""


LINGER_S = 1.0
"""Seconds aiohttp keeps reading (and dropping) the rest of a body answered early before it closes."""


class StartupError(Exception):
    """Start-up cannot go on; the message says why and what to do. ``code``: the exit status
    (2 a configuration problem — settings, model, policy file, credentials; 1 the environment —
    API server unreachable, port taken)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


class Service:
    """Every part of a running extender, wired together (tests build one with a fake API)."""

    def __init__(self, settings: ExtenderSettings, api: Any, engine: PolicyEngine, metrics: Metrics):
        self.settings = settings
        self.metrics = metrics
        self.api = api
        self.cache = ClusterCache(
            settings.gpu,
            settings.policy.seed,  # start-up only: a policy file's seed is ignored (PolicyEngine._start_up_seed)
            rejections=Rejections(lambda kind, reason: metrics.objects_rejected.labels(kind, reason).inc()),
            scheduler_name=settings.kubernetes.scheduler_name,
        )
        self.engine = engine
        self.ring = DecisionRing(settings.decision_ring_size)
        self.binder = (
            Binder(self.cache, self.engine, api, settings.gpu, settings.kubernetes) if api is not None else None
        )
        self.extender = Extender(self.cache, self.engine, self.binder, self.ring, settings, self.metrics)
        self.health = Health()
        self.informers: list[Informer] = []
        self.gc_pause = GcPause()
        """The process's pause of the cyclic GC: the verbs' and the two informers' lists share it."""
        if isinstance(api, KubeApi):
            api.on_slot_wait = metrics.api_slot_wait.observe
        if api is not None:
            self.informers = [
                Informer(
                    api,
                    "nodes",
                    NODES_PATH,
                    self.cache.replace_nodes_in_slices,
                    self._apply_node,
                    settings.kubernetes,
                    self.metrics,
                    rejections=self.cache.rejections,
                    gc_pause=self.gc_pause,
                ),
                Informer(
                    api,
                    "pods",
                    PODS_PATH,
                    self.cache.replace_pods_in_slices,
                    self._apply_pod,
                    settings.kubernetes,
                    self.metrics,
                    rejections=self.cache.rejections,
                    gc_pause=self.gc_pause,
                ),
            ]
        self.load: LoadPoller | None = None
        if settings.prometheus.url:
            self.load = LoadPoller(settings.prometheus, lambda: self.cache.addresses, self.cache.set_load, self.metrics)
            self.metrics.add_collector(self.load.collect)
        self.metrics.add_collector(self._collect)
        self.tasks: dict[str, asyncio.Task[Any]] = {}
        self.status_tls: StatusTls | None = None
        """The status listener's TLS (``server.statusTls``); serve() sets it."""
        self.addresses: dict[str, Any] = {}
        """Where the listeners ended up (``verbs``, ``status``: (host, port)); port 0 picks a free one."""
        self.health.checks["cache"] = lambda: None if self.cache.ready else "nodes and pods not listed yet"
        self.health.checks["tasks"] = self._dead_tasks
        self.health.checks["watches"] = self._watches_down
        self.health.liveness["tasks"] = self._dead_tasks

    # -- watch callbacks --------------------------------------------------------------------------
    def _apply_node(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.cache.delete_node(identity(obj)[1])
        else:
            self.cache.set_node(obj)

    def _apply_pod(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            uid = identity(obj)[2]
            self.cache.delete_pod(uid)
            self.extender.memory.pop(uid)
        else:
            self.cache.set_pod(obj)

    def _collect(self) -> list[Metric]:
        c = self.cache
        return [
            gauge("rlsched_extender_cache_nodes", "Nodes in the cache", len(c.nodes)),
            gauge("rlsched_extender_cache_pods", "Pods holding resources in the cache", len(c.pods)),
            gauge("rlsched_extender_cache_pending_pods", "Pending pods seen by the watch", len(c.pending)),
            gauge("rlsched_extender_cache_age_seconds", "Seconds since the last watch event", c.age_s()),
            gauge(
                "rlsched_extender_cache_unplaceable_pods",
                "Bound pods that do not fit the cached node",
                sum(1 for e in c.pods.values() if e.placement is None),
            ),
            gauge("rlsched_extender_cache_rebuilds", "ClusterState rebuilds since start", c.stats.rebuilds),
            gauge("rlsched_extender_decision_ring_last", "Cursor of the newest decision record", self.ring.last),
            *self._gpu_gauges(),
            *self._status_tls_gauges(),
        ]

    def _status_tls_gauges(self) -> list[Metric]:
        """When the status certificate expires, for an alert that fires while there is time to renew
        (the chart's RLSchedulerStatusCertExpiring): a rotation that keeps failing to load, or a
        cert-manager that stopped renewing, shows here weeks before clients refuse the port."""
        tls = self.status_tls
        if tls is None or tls.not_after is None:
            return []
        return [
            gauge(
                "rlsched_extender_status_tls_not_after_seconds",
                "When the status listener's serving certificate expires (notAfter, Unix seconds)",
                tls.not_after,
            )
        ]

    def _gpu_gauges(self) -> list[Metric]:
        state = self.cache.state
        if state is None:
            return []
        return [
            gauge(
                "rlsched_extender_gpu_milli_capacity",
                "GPU milli on the cached nodes (cards × 1000)",
                state.gpu_milli_capacity,
            ),
            gauge(
                "rlsched_extender_gpu_milli_allocated",
                "GPU milli held by bound and assumed pods in the cache",
                state.gpu_milli_allocated,
            ),
        ]

    def _dead_tasks(self) -> str | None:
        dead = [name for name, t in self.tasks.items() if t.done()]
        return f"background task(s) stopped: {', '.join(dead)}" if dead else None

    def _watches_down(self) -> str | None:
        """Readiness: only a watch down longer than WATCH_DOWN_NOT_READY_S (the initial list is the
        ``cache`` check's)."""
        if not self.cache.ready:
            return None
        down = [
            f"{i.resource} for {i.down_for():.0f} s ({i.last_error})"
            for i in self.informers
            if not i.up and i.down_for() > WATCH_DOWN_NOT_READY_S
        ]
        return f"watch down: {'; '.join(down)}" if down else None

    async def _supervise(self, name: str, run: Callable[[], Any], base_s: float = 1.0) -> None:
        """Run ``run()`` forever: whenever it ends — returns or raises — log it and start it again
        after a backoff with jitter. Only cancellation stops the supervisor."""
        failures = 0
        while True:
            started = asyncio.get_running_loop().time()
            try:
                await run()
                why = "ended"
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a background task must come back, whatever killed it
                why = f"failed: {describe(exc)}"
                log.error(
                    "background task %s %s", name, why, exc_info=exc, extra={"event": "task_failed", "task": name}
                )
            failures = 1 if asyncio.get_running_loop().time() - started > 60 else failures + 1
            delay = backoff_delay(base_s, failures, random.random())
            log.warning(
                "background task %s %s; restarting in %.1f s",
                name,
                why,
                delay,
                extra={"event": "task_restart", "task": name},
            )
            if name.startswith("watch-"):
                self.metrics.watch_restarts.labels(name[len("watch-") :], "task-ended").inc()
            await asyncio.sleep(delay)

    # -- lifecycle --------------------------------------------------------------------------------
    async def sync(self) -> None:
        """The initial list of nodes and pods."""
        for informer in self.informers:
            try:
                await informer.sync()
            except ApiError as exc:
                hint = {
                    0: "is the API server running and the kubeconfig's server address right?",
                    401: "the credentials were rejected (token expired? wrong kubeconfig user?)",
                    403: f"RBAC: the extender needs list/watch on {informer.resource}",
                }.get(exc.status, "")
                raise StartupError(f"cannot list {informer.resource}: {exc}" + (f" — {hint}" if hint else "")) from None

    async def background(self, app: web.Application) -> AsyncIterator[None]:
        """cleanup_ctx of the verb app: start the background tasks, cancel and await them on exit."""
        runs: dict[str, Callable[[], Any]] = {f"watch-{i.resource}": i.run for i in self.informers}
        runs["policy-poll"] = lambda: self.engine.run_poller(self.settings.policy_poll_s)
        if self.load is not None:
            runs["prometheus"] = self.load.run
        runs["expire"] = self._expire
        for name, run in runs.items():
            self.tasks[name] = asyncio.create_task(self._supervise(name, run), name=name)
        try:
            yield
        finally:
            for task in self.tasks.values():
                task.cancel()
            await asyncio.gather(*self.tasks.values(), return_exceptions=True)
            self.tasks.clear()
            if self.load is not None:
                await self.load.close()
            self.engine.close()

    async def _expire(self) -> None:
        while True:
            await asyncio.sleep(min(5.0, self.settings.kubernetes.assumed_ttl_s / 2))
            self.cache.expire_uncertain(self.settings.kubernetes.assumed_ttl_s)
            self.cache.expire_reserved(self.settings.decision_cache_ttl_s)
            self.cache.expire_provisional()
            self.cache.retry_unplaced()

    def status_extra(self) -> dict[str, Any]:
        out: dict[str, Any] = {"watches": {i.resource: i.status() for i in self.informers}}
        out["statusTls"] = self.status_tls.status() if self.status_tls is not None else {"enabled": False}
        if self.load is not None:
            out["load"] = self.load.status()
        return out


def _runner(
    app: web.Application, srv: ServerSettings, listener: str = "http", metrics: Metrics | None = None
) -> web.AppRunner:
    """A listener's runner. lingering_time: after an early answer (408, 413, 401) aiohttp reads and drops
    the rest of the body for this long before closing; its default of 10 s would let a stalled client
    keep the connection. logger: aiohttp's own log of the requests it cannot parse (answered 400 before
    any middleware), throttled and counted in ``bad_requests_total{verb="http"}`` (HttpServerLog) —
    it would log each with a traceback at ERROR, for anything that can reach the port."""
    count = (lambda: metrics.bad_requests.labels(BAD_HTTP_VERB).inc()) if metrics is not None else None
    return web.AppRunner(
        app,
        logger=HttpServerLog(listener, count),
        access_log=None,
        shutdown_timeout=srv.shutdown_timeout_s,
        keepalive_timeout=srv.idle_timeout_s,
        lingering_time=LINGER_S,
        auto_decompress=False,  # aiohttp would inflate a gzip body as it arrives, read or not (app.read_body)
    )


def verb_ssl_context(tls: TlsSettings) -> ssl.SSLContext | None:
    """Mutual TLS for the verb listener: our certificate, and callers must present one signed by
    ``clientCaFile`` (None without ``server.tls``). ConfigError names the file that cannot be used."""
    if not tls.cert_file:
        return None
    try:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=tls.client_ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"server.tls.clientCaFile {tls.client_ca_file}: {getattr(exc, 'strerror', None) or exc}"
        ) from None
    try:
        ctx.load_cert_chain(
            tls.cert_file, tls.key_file, password=no_passphrase("server.tls.keyFile", tls.key_file or "")
        )
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"server.tls.certFile {tls.cert_file} / keyFile {tls.key_file}: {getattr(exc, 'strerror', None) or exc}"
        ) from None
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def limit_native_threads() -> None:
    """One BLAS/OpenMP thread per process. Scoring matrices are small: on a shared 2-core machine
    OpenBLAS's threads made a 1,000-node MLP 36× slower (15 ms instead of 0.4 ms)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - a dependency
        log.warning("threadpoolctl missing: set OPENBLAS_NUM_THREADS=1 for predictable latency")
        return
    threadpool_limits(limits=1)


async def serve(
    settings: ExtenderSettings,
    api: Any = None,
    model_loader: Callable[..., Any] = load_model,
    stop: asyncio.Event | None = None,
    ready: Callable[[Service], None] | None = None,
) -> int:
    """Run until ``stop`` is set or SIGTERM/SIGINT. Raises StartupError with a clear message.

    Callers that own the process (the CLI, the benchmark) call :func:`limit_native_threads` first."""
    metrics = Metrics()
    engine = PolicyEngine(settings.policy, settings.policy_file, model_loader, metrics)
    try:
        check_complete(settings)
        verb_ssl = verb_ssl_context(settings.server.tls)
        status_tls = None
        if settings.server.status_tls.cert_file:
            status_tls = StatusTls(settings.server.status_tls, lambda r: metrics.status_tls_reloads.labels(r).inc())
        engine.start(strict_model=settings.strict_model)
    except ConfigError as exc:
        raise StartupError(str(exc), 2) from None
    if api is None:
        try:
            api = KubeApi.from_settings(settings.kubernetes)
        except ValueError as exc:
            raise StartupError(str(exc), 2) from None
        log.info("API server %s (%s)", api.host, getattr(api, "source", ""), extra={"event": "api"})
    service = Service(settings, api, engine, metrics)
    service.status_tls = status_tls
    srv = settings.server
    connection_metrics = ConnectionMetrics(metrics.registry)
    status_guard = ConnectionGuard("status", srv.header_timeout_s, srv.status_max_connections, connection_metrics)
    verb_guard = ConnectionGuard("verbs", srv.header_timeout_s, srv.max_connections, connection_metrics)
    auth: Authenticator | None = None
    if settings.auth.mode == "kubernetes":
        auth = Authenticator(api, settings.auth, metrics.registry)
    else:
        log.warning(
            "auth.mode is none: /status and /decisions answer anyone who reaches %s:%d (local development only)",
            srv.status_host,
            srv.status_port,
            extra={"event": "auth_off"},
        )
    status_app = make_status_app(
        service.extender,
        service.metrics,
        service.health,
        service.status_extra,
        auth=auth,
        protect_metrics=settings.auth.protect_metrics,
        connections=status_guard,
    )
    if status_tls is not None:
        status_app.cleanup_ctx.append(status_tls.cleanup_ctx)
    status_runner = _runner(status_app, srv, "status", metrics)
    await status_runner.setup()
    verb_runner: web.AppRunner | None = None
    try:
        try:
            await GuardedSite(
                status_runner,
                srv.status_host,
                srv.status_port,
                status_guard,
                ssl_context=status_tls.context if status_tls is not None else None,
            ).start()
        except OSError as exc:
            raise StartupError(
                f"cannot listen on {settings.server.status_host}:{settings.server.status_port} "
                f"(server.statusPort): {exc.strerror or exc}"
            ) from None
        service.addresses["status"] = status_runner.addresses[0][:2]
        await service.sync()
        gc.collect()
        gc.freeze()
        verb_app = make_app(
            service.extender, service.metrics, settings, connections=verb_guard, gc_pause=service.gc_pause
        )
        verb_app.cleanup_ctx.append(service.background)
        verb_runner = _runner(verb_app, srv, "verbs", metrics)
        await verb_runner.setup()
        try:
            await GuardedSite(verb_runner, srv.host, srv.port, verb_guard, ssl_context=verb_ssl, backlog=1024).start()
        except OSError as exc:
            raise StartupError(
                f"cannot listen on {settings.server.host}:{settings.server.port} (server.port): {exc.strerror or exc}"
            ) from None
        service.addresses["verbs"] = verb_runner.addresses[0][:2]
        service.health.started = True
        log.info(
            "extender serving: verbs on %s://%s:%d%s, status on %s://%s:%d (auth %s%s); %d nodes, %d pods; mode %s, "
            "model %s, fallback %s",
            "https" if verb_ssl else "http",
            srv.host,
            srv.port,
            srv.path_prefix or "",
            "https" if status_tls is not None else "http",
            srv.status_host,
            srv.status_port,
            settings.auth.mode,
            ", /metrics too" if auth is not None and settings.auth.protect_metrics else "",
            len(service.cache.nodes),
            len(service.cache.pods),
            service.engine.settings.mode,
            service.engine.model_info.version or "none",
            service.engine.fallback_scorer.name,
            extra={"event": "serving"},
        )
        if ready is not None:
            ready(service)
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):  # pragma: no cover - not the main thread
                pass
        await stop.wait()
        log.info("shutting down", extra={"event": "shutdown"})
        return 0
    finally:
        service.health.stopping = True  # /readyz says so while the listeners close
        if verb_runner is not None:
            await verb_runner.cleanup()
        await status_runner.cleanup()
        if api is not None and hasattr(api, "close"):
            await api.close()
