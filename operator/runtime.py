"""Everything the handlers share, built once at start-up and kept in kopf's ``memo``.

:func:`start_runtime` wires the sink, the extender client, the rollout, the decision log with its
drainer and outcome tracker, and the requeuer, and starts the background tasks (drain, requeue)
inside kopf's event loop; :meth:`Runtime.stop` cancels and awaits them and closes the log (fsync),
so a SIGTERM loses nothing that was acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from . import metrics as metrics_listener
from .decisionlog import DecisionLog, Drainer, LoadProbe, OutcomeTracker
from .extender_client import ExtenderClient
from .rebalancer import Metrics, Rebalancer
from .requeue import PendingPod, Rejections, Requeuer
from .rollout import ModelFetcher, Rollout
from .settings import OperatorSettings
from .sink import ConfigMapSink, DirectorySink, PolicySink

log = logging.getLogger("rlsched.operator")


@dataclass
class Runtime:
    """The operator's parts (module docstring)."""

    settings: OperatorSettings
    kube: Any
    sink: PolicySink
    extender: ExtenderClient
    rollout: Rollout
    requeuer: Requeuer
    rejections: Rejections
    drainer: Drainer
    decision_log: DecisionLog | None = None
    tracker: OutcomeTracker | None = None
    rebalancer: Rebalancer | None = None
    """The rebalancer (``rebalancer.enabled``); its cycles run from a timer on the served policy."""
    reward_weights: dict[str, float] = field(default_factory=dict)
    """The served policy's ``spec.rewardWeights`` (written into new log segments' headers)."""
    objective: dict[str, float] = field(default_factory=dict)
    """The served policy's ``spec.objective``, every field (written into new log segments' headers)."""
    runs: Counter[tuple[str, int | None, str]] = field(default_factory=Counter)
    """(policy uid, generation, cause) → handler runs: the "no handler twice for one change" check."""
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    """The operator's Prometheus metrics (served at ``metricsEndpoint``)."""
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    def lock(self, key: str) -> asyncio.Lock:
        """One rollout at a time per policy (the status timer skips while it is held)."""
        return self.locks.setdefault(key, asyncio.Lock())

    def start(self) -> None:
        if self.settings.requeue.enabled:
            self.tasks["requeue"] = asyncio.create_task(self.requeuer.run(), name="rlsched-requeue")
        self.tasks["drain"] = asyncio.create_task(self.drainer.run(), name="rlsched-drain-decisions")
        if self.settings.metrics_endpoint:
            self.tasks["metrics"] = asyncio.create_task(
                metrics_listener.serve(self.registry, self.settings.metrics_endpoint), name="rlsched-metrics"
            )

    async def stop(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        self.tasks.clear()
        try:
            # One last drain, so decisions made up to the shutdown are in the log.
            if self.decision_log is not None:
                await asyncio.wait_for(self.drainer.drain_once(), timeout=3.0)
        except Exception as exc:  # noqa: BLE001 - best effort on the way out
            log.info("final drain skipped: %s", exc)
        if self.tracker is not None:
            await self.tracker.close()
        await self.rejections.close()
        if self.rebalancer is not None:
            await self.rebalancer.close()
        await self.extender.close()
        if self.decision_log is not None:
            self.decision_log.close()

    def problems(self) -> list[str]:
        """Dead background tasks (for the liveness probe)."""
        return [f"background task {name} stopped" for name, t in self.tasks.items() if t.done()]


def make_sink(settings: OperatorSettings, kube: Any) -> PolicySink:
    s = settings.sink
    if s.kind == "directory":
        return DirectorySink(s.directory or ".", s.mount_path)
    return ConfigMapSink(kube, s.namespace, s.configmap, s.mount_path or "/etc/rlsched/policy", s.max_model_bytes)


def start_runtime(
    settings: OperatorSettings,
    kube: Any,
    lookup: Callable[[str], PendingPod | None],
    pending: Callable[[], Iterable[PendingPod]],
) -> Runtime:
    """Build the runtime (``lookup``/``pending`` read kopf's pod index) and start its tasks."""
    ext = settings.extender
    client = ExtenderClient(ext.status_url, ext.timeout_s, token_file=ext.token_file, ca_file=ext.ca_file)
    sink = make_sink(settings, kube)
    rollout = Rollout(sink, client, ModelFetcher(kube), ext.rollout_timeout_s, ext.poll_interval_s)
    requeuer = Requeuer(settings.requeue, lookup, pending, kube.patch_pod_annotations, kube.post_event)
    rejections = Rejections(kube.patch_pod_annotations, kube.post_event, lookup=lookup)
    dl = settings.decision_log
    decision_log = tracker = None
    holder: dict[str, Any] = {}
    if dl.path:
        decision_log = DecisionLog(
            dl.path,
            dl.segment_bytes,
            dl.max_bytes,
            dl.fsync,
            header=lambda: {
                "policy": f"{settings.policy.namespace}/{settings.policy.name}",
                "rewardWeights": holder["rt"].reward_weights or None,
                "objective": holder["rt"].objective or None,
            },
        )
        probe = LoadProbe(dl.prometheus_url, dl.load_queries, dl.node_label) if dl.prometheus_url else None
        tracker = OutcomeTracker(decision_log.awrite, probe, dl.load_delay_s)
    drainer = Drainer(
        client,
        decision_log,
        [requeuer.on_verdict, requeuer.on_room, rejections.on_verdict],
        dl.drain_interval_s,
        dl.drain_limit,
    )
    rt = Runtime(
        settings=settings,
        kube=kube,
        sink=sink,
        extender=client,
        rollout=rollout,
        requeuer=requeuer,
        rejections=rejections,
        drainer=drainer,
        decision_log=decision_log,
        tracker=tracker,
    )
    holder["rt"] = rt
    if settings.rebalancer.enabled:
        rt.rebalancer = Rebalancer(
            settings.rebalancer,
            settings.scope.scheduler_name,
            kube,
            write_log=decision_log.awrite if decision_log is not None else None,
            metrics=Metrics(rt.registry),
            policy_ref=f"{settings.policy.namespace}/{settings.policy.name}",
            persist=lambda recent: kube.patch_policy_status(
                settings.policy.namespace, settings.policy.name, {"rebalance": {"recent": recent}}
            ),
            namespaces=settings.scope.namespaces,  # evict only where the operator works (and may)
        )
    if decision_log is not None:
        decision_log.open()
    rt.start()
    return rt
