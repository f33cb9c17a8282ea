"""The rebalancer: a few evictions per cycle, chosen by the policy, that undo fragmentation and relieve
hot nodes; the evicted pods come back through kube-scheduler and the extender.

One cycle (:meth:`Rebalancer.cycle`, driven by a kopf timer on the served SchedulingPolicy when its
``spec.rebalance.enabled`` is true and ``intervalSeconds`` have passed):

1. list nodes and the pods bound to them (every scheduler's: they all hold resources), and the
   namespaces when ``namespaceSelector`` is set;
2. build the cluster state with the extender's own adapters (:class:`rlsched.extender.cache.ClusterCache`:
   the same NodeSpec/PodSpec reading, the same card annotations, the same rejection of unreadable
   objects — logged once per version, counted, skipped). Node load comes from Prometheus through the
   extender's own poller when ``rebalancer.prometheus.url`` is set (one round per cycle); without it
   the load stays NaN and the planner's hot-node term has nothing to act on (docs/operator.md);
3. the candidates: pods the safety rules allow (:mod:`.rebalance_select`; among them the operator's
   watched namespaces, ``scope.namespaces``, the only ones where the chart lets it evict) whose
   controller is still within its budget (:mod:`.rebalance_budget`, merged with
   ``status.rebalance.recent`` first: another replica may have evicted meanwhile);
4. the moves: :func:`rlsched.policy.rebalance.plan_moves` (the policy decides; never more than the
   budget left this cycle and this hour; the target is where the served policy's fallback heuristic
   would place the pod now), run off the event loop;
5. each move: a policy/v1 Eviction (dry-run: with ``dryRun: [All]``, which checks everything and
   changes nothing). A PodDisruptionBudget that refuses (429) is counted ``blocked_by_pdb`` and the
   next move is tried (a pod that more than one budget selects is refused by the API server with a
   500 every time: ``multiple_pdbs``, a refusal too); a refused pod is not a candidate for
   :data:`REFUSAL_COOLDOWN_S` (dry runs keep their own cooldown: a dry run's refusal does not hold back
   a real run), and when every move of a plan was refused the planner is asked again without those
   pods (:data:`MAX_REPLANS`). Each eviction is dated by the clocks as it is sent (its budget
   record, its controller's check, its cooldown), not when the cycle began: a cycle may take minutes.
   Every duration (the interval, the cooldowns, the budget's windows) is measured on the monotonic
   clock (:attr:`Rebalancer.monotonic`); the wall clock only dates what others read (the status, the
   decision log) and measures the pods' ages (from the API server's timestamps). A
   move whose controller already used its budget in this cycle is skipped (the planner does not know
   controllers). An eviction whose answer is lost (no HTTP answer: a timeout, a dropped
   connection — :class:`.kube.KubeError` status 0 — or a 5xx) may have been carried out by the API
   server all the same: it is ``unknown``, and it is charged to the cycle, hourly and per-owner budgets
   exactly like an eviction (the safe side: at worst a move fewer), logged once; the pod also waits out
   the cooldown (if it was not evicted, it is not asked for again at once). Every move gets an
   Event on the pod, a count in ``rlsched_operator_rebalance_evictions_total{result}`` and a
   ``rebalance`` line in the decision log, each with the planner's reason and gain.

The cycle's summary goes to ``status.rebalance`` (the handler patches it), with the evictions of the
last 30 days (the longest owner window a spec may set, :data:`.rebalance_budget.KEEP_S`), the newest
1,000 at most (:data:`.rebalance_budget.MAX_RECENT`), so a restarted operator keeps honouring them; a dry
run reads them in but forgets none.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client import Counter as PromCounter

from rlsched.extender.cache import BOUND, RELIST_SLICE, ClusterCache
from rlsched.extender.objects import qos_class
from rlsched.extender.policy import default_typical, load_typical
from rlsched.extender.prometheus import LoadPoller
from rlsched.extender.settings import GpuConventions
from rlsched.policy.scorers import make_scorer
from rlsched.policy.typical import TypicalPods

from .conditions import now_iso
from .kube import KubeError
from .log_once import LogOnce
from .pod_usage import read_pod_cpu
from .rebalance_budget import MAX_RECENT, Ledger, allowance, owners_over_budget
from .rebalance_select import REASONS, namespace_filter, namespace_labels, namespace_watched, owner_key, why_not
from .rebalance_spec import RebalanceSpec
from .settings import RebalancerSettings

log = logging.getLogger("rlsched.operator.rebalancer")

RESULTS = (
    "evicted",
    "unknown",
    "dry_run",
    "blocked_by_pdb",
    "multiple_pdbs",
    "throttled",
    "gone",
    "forbidden",
    "error",
    "invalid_move",
)
"""``result`` label values of the evictions counter: a small fixed set.

evicted: the Eviction was accepted; unknown: its answer was lost (status 0, or a 5xx other than
``multiple_pdbs``), so it may have been carried out — charged to the budget like ``evicted``
(:data:`CHARGED`); dry_run: it would have been accepted (dry-run mode; a lost dry-run answer is
``error``: a dry run changes nothing); blocked_by_pdb: a PodDisruptionBudget refused it (429);
multiple_pdbs: more than one PodDisruptionBudget selects the pod, which the Eviction API refuses with a
500 every time (:func:`multiple_pdbs`); throttled: a 429 that is not a PDB (API priority and fairness);
gone: the pod was deleted or replaced meanwhile (404, or 409 on the UID precondition); forbidden: the
operator may not evict (403: RBAC or the chart's admission policy — operator.rebalancer.enabled);
error: any other failure; invalid_move: the planner named a pod or node that is not a candidate."""
CHARGED = frozenset({"evicted", "unknown"})
"""Results that may have moved a pod: each is recorded in the ledger and spends the budget."""
MAX_STATUS_MOVES = 50
"""Moves listed in ``status.rebalance.moves`` (the cycle's, at most)."""
COOLDOWN_RESULTS = frozenset({"blocked_by_pdb", "multiple_pdbs", "forbidden", "error", "unknown"})
"""Results that keep the pod out of the candidates for :data:`REFUSAL_COOLDOWN_S` (a PodDisruptionBudget
that does not allow a disruption now, more than one that selects the pod, an eviction the operator may
not make in that namespace, any other failure; and a lost answer: if the pod was evicted it is gone
anyway, and if it was not, the API server is in trouble with it — each try would be charged again):
the planner is deterministic, and without the pause it would pick the same pod every cycle."""
REFUSAL_COOLDOWN_S = 900.0
"""How long a pod whose eviction was refused is not a candidate (15 minutes: long enough for the next
cycles to try other pods, short enough for a PodDisruptionBudget that allows a disruption again)."""
MAX_REFUSED = 10_000
"""Pods on that cooldown remembered at most (the oldest forgotten first)."""
MAX_REPLANS = 4
"""Plans after the first in one cycle, made only when every move of the previous plan was refused or
skipped (without them, one refused pod at the top of the plan ends the cycle with nothing moved)."""


MULTIPLE_PDBS_MESSAGE = "more than one poddisruptionbudget"
"""In the API server's answer to an eviction of a pod that several PodDisruptionBudgets select (500,
"This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.")."""


def multiple_pdbs(status: int, text: str) -> bool:
    """Whether an eviction's error is the API server's refusal of a pod with more than one
    PodDisruptionBudget: a 500 that is an answer, not a lost one — the same for every try until the
    budgets change, so it is a refusal (cooldown, no budget spent), not ``unknown``."""
    return status == 500 and MULTIPLE_PDBS_MESSAGE in text.lower()


class Metrics:
    """The rebalancer's Prometheus counters, in a registry the caller serves (or not)."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry()
        self.evictions = PromCounter(
            "rlsched_operator_rebalance_evictions",
            "Moves the rebalancer tried, by result (evicted, dry_run, blocked_by_pdb, ...)",
            ["result"],
            registry=self.registry,
        )
        self.cycles = PromCounter(
            "rlsched_operator_rebalance_cycles",
            "Rebalancing cycles, by outcome (planned, no_candidates, budget_exhausted, error)",
            ["outcome"],
            registry=self.registry,
        )
        self.skipped = PromCounter(
            "rlsched_operator_rebalance_pods_skipped",
            "Pods the safety rules kept from being candidates, by rule (counted per cycle)",
            ["rule"],
            registry=self.registry,
        )
        self.pod_usage = PromCounter(
            "rlsched_operator_rebalance_pod_usage_queries",
            "Reads of each pod's CPU use from Prometheus (podCpuQuery), by result (ok, error)",
            ["result"],
            registry=self.registry,
        )
        for r in RESULTS:
            self.evictions.labels(result=r)


def latency_sensitive(pod: Mapping[str, Any], label: str, gpu: GpuConventions) -> bool:
    """Whether the planner treats ``pod`` as latency-sensitive: its ``label`` (``"true"`` or not) when
    the pod has it, else the extender's reading of the class (:func:`~rlsched.extender.objects.qos_class`:
    ``gpu.latencySensitiveLabel``, then Koordinator's ``LSE``/``LSR``/``LS``). Kubernetes' own
    ``Guaranteed`` does not count here: most GPU pods are, and the planner's weights are for the few."""
    meta = pod.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    if isinstance(labels, Mapping):
        own = labels.get(label)
        if isinstance(own, str):
            return own == "true"
    return qos_class(labels, None, gpu) == "LS"


def load_planner() -> Any:
    """``rlsched.policy.rebalance`` (``plan_moves``, ``Candidate``, ``RebalanceSettings``), imported when
    first needed; None (logged) when the installed policy package has none."""
    try:
        return importlib.import_module("rlsched.policy.rebalance")
    except ImportError as exc:
        log.error("the rebalancer's planner rlsched.policy.rebalance cannot be imported: %s", exc)
        return None


@dataclass
class CycleReport:
    """One cycle, as ``status.rebalance`` shows it (``as_status``)."""

    at: float
    dry_run: bool
    outcome: str
    message: str = ""
    candidates: int = 0
    planned: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    moves: list[dict[str, Any]] = field(default_factory=list)


class Rebalancer:
    """State kept between cycles: the cluster cache, the budget ledger, the counters."""

    def __init__(
        self,
        settings: RebalancerSettings,
        scheduler_name: str,
        kube: Any,
        write_log: Callable[[list[dict[str, Any]]], Awaitable[object]] | None = None,
        planner: Any = None,
        metrics: Metrics | None = None,
        policy_ref: str = "",
        clock: Callable[[], float] = time.time,
        load_query: Callable[[str], Awaitable[Any]] | None = None,
        persist: Callable[[list[dict[str, Any]]], Awaitable[object]] | None = None,
        namespaces: Iterable[str] = (),
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self.settings, self.scheduler_name, self.kube = settings, scheduler_name, kube
        self.monotonic = monotonic
        """What every duration is measured on: the interval, the cooldowns, the budget's hour and owner
        window (the ledger's clock, :mod:`.rebalance_budget`). ``clock`` (the wall clock) only dates
        what others read: the status (``lastCycle``, the ledger's ``recent``), the decision log, and
        the pods' ages (the API server's timestamps). On the wall clock, NTP stepping it an hour
        forward renewed the hour's budget at once, and a step back stopped the cycles for an hour."""
        self.persist = persist
        """Writes the ledger (``status.rebalance.recent``) before each eviction; None: only the handler's
        patch after the cycle (tests, and callers without a SchedulingPolicy to write to)."""
        self.write_log, self.policy_ref, self.clock = write_log, policy_ref, clock
        self.watched = namespace_watched(namespaces)
        """Whether a namespace is in the operator's scope (``scope.namespaces``; empty: all): the rule
        ``not-watched`` (:mod:`.rebalance_select`)."""
        self._planner = planner
        self.metrics = metrics or Metrics()
        self.cache = ClusterCache(settings.gpu, scheduler_name=scheduler_name)
        self.load: LoadPoller | None = None
        if settings.prometheus.url or load_query is not None:
            self.load = LoadPoller(
                settings.prometheus, lambda: self.cache.addresses, self.cache.set_load, query=load_query
            )
        self.ledger = Ledger()
        self.dry_ledger = Ledger()
        """What dry runs would have moved: the same budgets apply to the preview (memory only)."""
        self.refused: dict[str, float] = {}
        """UID → until when (:attr:`monotonic`) a pod whose eviction was refused is not a candidate
        (:meth:`_refuse`)."""
        self.dry_refused: dict[str, float] = {}
        """The same for dry runs: a dry run's refusal must not keep a pod from the next real run (nor
        a real refusal from the preview: each shows what it would do on its own)."""
        self.totals: Counter[str] = Counter()
        self._last_cycle: float | None = None
        """When the last cycle ran (or was skipped: :meth:`skipped`), on :attr:`monotonic`."""
        self._typical: TypicalPods | None = None
        self._log_once = LogOnce(log)
        self._scorers: dict[str, Any] = {}
        self._usage_failing = False

    # -- parts ------------------------------------------------------------------------------------
    @property
    def planner(self) -> Any:
        if self._planner is None:
            self._planner = load_planner()
        return self._planner

    @property
    def typical(self) -> TypicalPods:
        if self._typical is None:
            path = self.settings.typical_pods_path
            self._typical = load_typical(path) if path else default_typical()
        return self._typical

    def skipped(self) -> None:
        """A cycle that was due did not run (the extender did not answer): the next waits the interval."""
        self._last_cycle = self.monotonic()

    def due(self, spec: RebalanceSpec) -> bool:
        return self._last_cycle is None or self.monotonic() - self._last_cycle >= spec.interval_s

    def _once(self, key: str, message: str, *args: Any) -> None:
        """Log a recurring problem once (until it changes)."""
        self._log_once.log(key, logging.WARNING, message, *args)

    # -- the cycle --------------------------------------------------------------------------------
    def scorer(self, fallback: str | None) -> Any:
        """The placement policy the planner asks where a pod would go: the served policy's fallback
        heuristic (what the extender places with when no model serves); None: the planner's default, FGD."""
        if not fallback:
            return None
        if fallback not in self._scorers:
            self._scorers.clear()
            self._scorers[fallback] = make_scorer(fallback, self.typical)
        return self._scorers[fallback]

    async def cycle(
        self, spec: RebalanceSpec, status: Mapping[str, Any] | None = None, fallback: str | None = None
    ) -> CycleReport:
        """One cycle (module docstring). Never raises for the cluster's contents; API failures end the
        cycle with outcome ``error`` and a message (the next cycle tries again). ``fallback``: the served
        policy's ``spec.fallback`` (:meth:`scorer`)."""
        now, t = self.clock(), self.monotonic()
        self._last_cycle = t
        # Every cycle, not only the first: another replica may have evicted while this one was paused.
        # A dry run reads the status in too (the handler writes the ledger back after every cycle: it
        # must not drop what the status holds) but forgets nothing: it does not touch the real budget.
        self.ledger.merge((status or {}).get("recent"), t, now)
        if not spec.dry_run:
            self.ledger.prune(t)
        self.dry_ledger.prune(t)
        self.refused = {uid: until for uid, until in self.refused.items() if until > t}
        self.dry_refused = {uid: until for uid, until in self.dry_refused.items() if until > t}
        report = CycleReport(at=now, dry_run=spec.dry_run, outcome="planned")
        try:
            await self._cycle(spec, now, t, report, fallback)
        except KubeError as exc:
            report.outcome, report.message = "error", f"cannot read the cluster: {exc}"
            self._once(f"kube:{exc.status}", "rebalancer: %s", report.message)
        except Exception as exc:  # noqa: BLE001 - one bad cycle must not stop the next
            report.outcome, report.message = "error", f"{type(exc).__name__}: {exc}"[:500]
            log.exception("rebalancer cycle failed")
        self.metrics.cycles.labels(outcome=report.outcome).inc()
        for rule, n in report.skipped.items():
            self.metrics.skipped.labels(rule=rule).inc(n)
        return report

    async def _cycle(
        self, spec: RebalanceSpec, now: float, t: float, report: CycleReport, fallback: str | None
    ) -> None:
        """The cycle's work; ``now`` on the wall clock (the pods' ages), ``t`` on :attr:`monotonic`
        (the budget, the cooldowns)."""
        planner = self.planner
        if planner is None:
            report.outcome, report.message = "error", "the planner rlsched.policy.rebalance is not installed"
            return
        ledger = self.dry_ledger if spec.dry_run else self.ledger
        budget = allowance(ledger, t, spec.max_moves_per_cycle, spec.max_moves_per_hour, spec.owner_window_s)
        if budget.left <= 0:
            report.outcome = "budget_exhausted"
            what = "dry-run moves" if spec.dry_run else "evictions"
            if budget.room <= 0:
                report.message = (
                    f"{ledger.counting(t, spec.owner_window_s)} {what} inside the hour or ownerWindowSeconds, "
                    f"as many as the operator keeps ({MAX_RECENT}): no more until the oldest leave them"
                )
            else:
                report.message = (
                    f"{ledger.in_last_hour(t)} {what} in the last hour (maxMovesPerHour {spec.max_moves_per_hour})"
                )
            return
        s = self.settings
        nodes = await self.kube.list_all("nodes", max_items=100_000)
        pods = await self.kube.list_all(
            "pods", max_items=s.max_pods, field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
        )
        ns_labels = (
            namespace_labels(await self.kube.list_all("namespaces", max_items=100_000))
            if spec.namespace_selector is not None
            else {}
        )
        # In slices, yielding between them, as the extender applies a relist: 5,000 pods in one step
        # held the operator's event loop for 0.36 s.
        for _ in self.cache.replace_nodes_in_slices(nodes):
            await asyncio.sleep(0)
        for _ in self.cache.replace_pods_in_slices(pods):
            await asyncio.sleep(0)
        self.cache.retry_unplaced()  # the extender sweeps every few seconds; this cache, every cycle
        state = self.cache.state
        if state is None:
            report.outcome, report.message = "no_candidates", "no readable nodes"
            return
        usage: dict[str, float] = {}
        if self.load is not None:
            await self.load.refresh()  # a failed query only leaves that column NaN (logged by the poller)
            if s.pod_cpu_query:
                usage = await self._pod_usage(s.pod_cpu_query)

        by_uid: dict[str, Mapping[str, Any]] = {}
        for pod in pods:
            meta = pod.get("metadata") if isinstance(pod, Mapping) else None
            uid = meta.get("uid") if isinstance(meta, Mapping) else None
            if isinstance(uid, str):
                by_uid[uid] = pod
        opted_in = namespace_filter(spec.namespace_selector, ns_labels)
        eligible: dict[str, tuple[Any, Mapping[str, Any], str]] = {}  # uid -> (entry, pod, owner)
        for i, (uid, entry) in enumerate(self.cache.pods.items()):
            if i % RELIST_SLICE == RELIST_SLICE - 1:  # ~30 µs a pod: let the operator's other work in
                await asyncio.sleep(0)
            pod = by_uid.get(uid)
            if pod is None or entry.placement is None or entry.status != BOUND:
                continue
            rule = why_not(pod, self.scheduler_name, opted_in, spec.min_pod_age_s, now, self.watched)
            if rule is not None:
                report.skipped[rule] += 1
                continue
            eligible[uid] = (entry, pod, owner_key(pod))
        full = owners_over_budget(
            ledger, (o for _, _, o in eligible.values()), t, spec.max_moves_per_owner, spec.owner_window_s
        )
        candidates = []
        by_key: dict[str, tuple[Any, Mapping[str, Any], str]] = {}
        refused = self._cooldown(spec.dry_run)
        for uid, (entry, pod, owner) in eligible.items():
            if owner in full:
                report.skipped["owner-budget"] += 1
                continue
            if refused.get(uid, -math.inf) > t:
                report.skipped["recently-refused"] += 1
                continue
            candidates.append(
                planner.Candidate(
                    key=entry.key,
                    node=entry.placement.node,
                    request=state.request(entry.spec),
                    placement=entry.placement,
                    latency_sensitive=latency_sensitive(pod, s.latency_sensitive_label, s.gpu),
                    cpu_usage_milli=usage.get(entry.key),
                )
            )
            by_key[entry.key] = (entry, pod, owner)
        report.candidates = len(candidates)
        if not candidates:
            report.outcome, report.message = "no_candidates", "no pod may be moved (status.rebalance.skipped says why)"
            return
        scorer = self.scorer(fallback)
        excluded: set[str] = set()  # candidates out of this cycle's later plans: tried, moved or over budget
        for _plan in range(1 + MAX_REPLANS):
            pool = [c for c in candidates if c.key not in excluded]
            if not pool or budget.left <= 0:
                break
            settings = planner.RebalanceSettings(
                max_moves_per_cycle=budget.left,
                min_gain=spec.min_gain,
                hot_threshold=spec.hot_threshold,
                fragmentation_weight=spec.fragmentation_weight,
                hot_weight=spec.hot_weight,
                migration_cost=spec.migration_cost,
                latency_sensitive_hot_weight=spec.latency_sensitive_hot_weight,
                latency_sensitive_weight=spec.latency_sensitive_weight,
                pod_gpu_weight=spec.pod_gpu_weight,
                destination_load_weight=spec.destination_load_weight,
            )
            # The planner runs off the event loop on a snapshot: nothing may change its arrays meanwhile.
            snapshot = state.copy()
            moves = await asyncio.to_thread(planner.plan_moves, snapshot, pool, self.typical, settings, scorer)
            report.planned += len(moves)
            before = len(excluded)
            moved = await self._carry_out(moves, by_key, excluded, ledger, budget, spec, report, state)
            # Plan again only when every move of this plan was refused or skipped, and it took a pod
            # out of the pool (else the next plan would be this one): the cluster is then as this plan
            # saw it, less those pods. After a move it is not (the next cycle reads it).
            if moved or len(excluded) == before:
                break
        if not report.moves:
            report.outcome = "no_moves"
            report.message = report.message or "the planner found no move worth its cost"

    async def _carry_out(
        self,
        moves: Any,
        by_key: Mapping[str, tuple[Any, Mapping[str, Any], str]],
        excluded: set[str],
        ledger: Ledger,
        budget: Any,
        spec: RebalanceSpec,
        report: CycleReport,
        state: Any,
    ) -> int:
        """Evict (or dry-run) one plan's moves within the budget; returns how many were carried out or
        may have been (charged). A refused move puts its pod on :data:`REFUSAL_COOLDOWN_S`; a move whose
        controller has used its budget in this cycle is skipped (``owner-budget``), and so is every later
        move of this plan for another pod of that controller (not ``invalid_move``: the planner named a
        candidate, it does not know controllers). Each of those leaves the pod in ``excluded``, and so
        does every move tried, for the caller's next plan.

        Each move reads the clocks just before its write ahead and eviction: planning, replans and slow
        API calls may have taken minutes since the cycle began, and a record dated at the cycle's start
        would leave the sliding hour (and the owner window) that much early — the next cycle could
        evict again within a true hour."""
        moved = 0
        held: set[str] = set()  # this plan's pods whose controller's budget ran out during it
        for move in list(moves)[: max(0, budget.left) + 10]:
            if budget.left <= 0:
                break
            move_key = getattr(move, "key", None)
            target = by_key.get(move_key) if isinstance(move_key, str) else None
            to_node = getattr(move, "to_node", -1)
            if (
                target is None
                or not isinstance(to_node, int)
                or not 0 <= to_node < state.num_nodes
                or to_node == target[0].placement.node
            ):
                await self._record(report, spec, None, move, "invalid_move", "", state)
                continue
            if move.key in held:  # a candidate when planned: its controller was moved since
                report.skipped["owner-budget"] += 1
                continue
            if move.key in excluded:  # tried already, or left out of this plan's pool
                await self._record(report, spec, None, move, "invalid_move", "", state)
                continue
            entry, pod, owner = target
            at, wall = self.monotonic(), self.clock()
            if ledger.owner_moves(owner, at, spec.owner_window_s) >= spec.max_moves_per_owner:
                # Its controller was moved earlier in this cycle: the planner does not know controllers.
                report.skipped["owner-budget"] += 1
                same = {k for k, (_, _, o) in by_key.items() if o == owner and k not in excluded}
                excluded.update(same)
                held.update(same)
                continue
            excluded.add(move.key)
            ahead = None
            if not spec.dry_run:  # written ahead: a kill after the eviction must not forget it
                ahead = ledger.add(owner, at, wall)
                if not await self._persist(ledger):
                    ledger.discard(ahead)
                    detail = "not evicted: it could not be recorded in status.rebalance.recent first"
                    await self._record(report, spec, (entry, pod, owner), move, "error", detail, state)
                    budget.cycle = 0  # the status cannot be written: no eviction this cycle
                    break
            result, detail = await self._evict(pod, spec.dry_run)
            if result in CHARGED or result == "dry_run":  # a dry run spends its own ledger (dry_ledger)
                if ahead is None:
                    ledger.add(owner, at, wall)
                budget.spend()
                moved += 1
            elif ahead is not None:
                ledger.discard(ahead)  # the status keeps it until the cycle's patch: fewer moves, never more
            if result in COOLDOWN_RESULTS:
                self._refuse(entry.uid, at, spec.dry_run)
            await self._record(report, spec, (entry, pod, owner), move, result, detail, state)
            if result == "throttled":  # the API server asks for fewer requests: no more this cycle
                budget.cycle = 0
                break
        return moved

    async def _persist(self, ledger: Ledger) -> bool:
        """Write the ledger to the status ahead of an eviction; False (logged once) when that fails."""
        if self.persist is None:
            return True
        try:
            await self.persist(ledger.dump())
        except Exception as exc:  # noqa: BLE001 - whatever the write raised, the eviction waits
            self._once("persist", "rebalancer: cannot write status.rebalance.recent before an eviction: %s", exc)
            return False
        return True

    def _cooldown(self, dry_run: bool) -> dict[str, float]:
        """The cooldown of the run's kind: dry runs keep their own (:attr:`dry_refused`)."""
        return self.dry_refused if dry_run else self.refused

    def _refuse(self, uid: str, now: float, dry_run: bool) -> None:
        """Keep a pod whose eviction was refused (or whose answer was lost) out of the candidates for a
        while (the planner is deterministic: it would pick the same pod again, and the same refusal
        would block every cycle), in the cooldown of the run's kind. ``now``: on :attr:`monotonic`."""
        refused = self._cooldown(dry_run)
        refused.pop(uid, None)
        refused[uid] = now + REFUSAL_COOLDOWN_S
        while len(refused) > MAX_REFUSED:
            del refused[next(iter(refused))]

    async def _evict(self, pod: Mapping[str, Any], dry_run: bool) -> tuple[str, str]:
        meta = pod.get("metadata") or {}
        try:
            await self.kube.evict_pod(meta["namespace"], meta["name"], meta["uid"], dry_run=dry_run)
        except KubeError as exc:
            text = str(exc)
            if exc.status == 429:
                return ("blocked_by_pdb" if "disruption budget" in text.lower() else "throttled"), text
            if exc.status in (404, 409):
                return "gone", text
            if multiple_pdbs(exc.status, text):
                self._once(
                    "multiple_pdbs",
                    "rebalancer: the API server refuses to evict a pod that more than one PodDisruptionBudget "
                    "selects (%s); such pods are tried again after the cooldown",
                    text,
                )
                return "multiple_pdbs", text
            if exc.status == 403:
                self._once(
                    "forbidden",
                    "rebalancer: evictions are forbidden (%s); grant pods/eviction in the watched namespaces "
                    "(chart: operator.rebalancer.enabled; or an admission policy refused it)",
                    text,
                )
                return "forbidden", text
            if not dry_run and (exc.status == 0 or exc.status >= 500):
                self._once(
                    "unknown",
                    "rebalancer: an eviction's answer was lost (%s); the API server may have carried it out, "
                    "so it is charged to the budget as an eviction (result unknown)",
                    text,
                )
                return "unknown", text
            return "error", text
        return ("dry_run" if dry_run else "evicted"), ""

    async def _record(
        self,
        report: CycleReport,
        spec: RebalanceSpec,
        target: tuple[Any, Mapping[str, Any], str] | None,
        move: Any,
        result: str,
        detail: str,
        state: Any,
    ) -> None:
        """The counter, the status entry, the Event on the pod and the decision-log line of one move."""
        self.metrics.evictions.labels(result=result).inc()
        self.totals[result] += 1
        key = str(getattr(move, "key", ""))[:300]
        reason = str(getattr(move, "reason", ""))[:300]
        gain = getattr(move, "gain", float("nan"))
        gain = float(gain) if isinstance(gain, (int, float)) and math.isfinite(gain) else None

        def node_name(i: Any) -> str | None:
            return state.names[i] if isinstance(i, int) and 0 <= i < state.num_nodes else None

        entry = {
            "pod": key,
            "from": node_name(getattr(move, "from_node", None)),
            "to": node_name(getattr(move, "to_node", None)),
            "reason": reason,
            "gain": None if gain is None else round(gain, 6),
            "result": result,
        }
        if len(report.moves) < MAX_STATUS_MOVES:
            report.moves.append(entry)
        if target is None:
            self._once(f"invalid:{key}", "rebalancer: the planner proposed an invalid move %s", entry)
            return
        _, pod, owner = target
        meta = pod.get("metadata") or {}
        gain_text = "n/a" if gain is None else f"{gain:.4f}"
        where = f"from {entry['from']} (intended: {entry['to']})"
        reason_event, type_, text = {
            "evicted": ("Rebalanced", "Normal", f"evicted by the rl-scheduler rebalancer to move it {where}"),
            "dry_run": ("RebalanceDryRun", "Normal", f"the rl-scheduler rebalancer would move it {where} (dry run)"),
            "unknown": (
                "RebalanceUnknown",
                "Warning",
                f"the rl-scheduler rebalancer asked to evict it to move it {where}; the answer was lost, "
                f"it may have been evicted: {detail}",
            ),
            "blocked_by_pdb": (
                "RebalanceBlocked",
                "Normal",
                f"a PodDisruptionBudget kept the rebalancer from moving it {where}",
            ),
            "multiple_pdbs": (
                "RebalanceBlocked",
                "Warning",
                f"more than one PodDisruptionBudget selects it, and the Eviction API refuses to evict such a pod: "
                f"the rebalancer could not move it {where}",
            ),
        }.get(result, ("RebalanceFailed", "Warning", f"the rebalancer could not move it {where}: {result} {detail}"))
        ref = {"apiVersion": "v1", "kind": "Pod", **{k: meta.get(k) for k in ("namespace", "name", "uid")}}
        await self.kube.post_event(ref, type_, reason_event, f"{text}; reason: {reason}; gain {gain_text}")
        log.info(
            "rebalance %s: %s %s → %s (%s, gain %s)%s",
            result,
            key,
            entry["from"],
            entry["to"],
            reason,
            gain_text,
            " [dry run]" if spec.dry_run else "",
            extra={"event": "rebalance", "pod": key, "result": result},
        )
        if self.write_log is not None:
            line = {
                "type": "rebalance",
                "policy": self.policy_ref,
                "pod": {k: meta.get(k) for k in ("uid", "namespace", "name")},
                "owner": owner,
                "from": entry["from"],
                "to": entry["to"],
                "reason": reason,
                "gain": entry["gain"],
                "result": result,
                "dryRun": spec.dry_run,
                "time": round(self.clock(), 3),
            }
            try:
                await self.write_log([line])
            except OSError as exc:
                log.error("cannot write a rebalance line to the decision log: %s", exc)

    async def _pod_usage(self, promql: str) -> dict[str, float]:
        """Millicores per ``namespace/name`` (:mod:`rlsched.operator.pod_usage`); a failure is logged once
        until the query answers again, and counted."""
        assert self.load is not None
        read = await read_pod_cpu(self.load.query, promql)
        result = "error" if read.error else "ok"
        self.metrics.pod_usage.labels(result=result).inc()
        if read.error and not self._usage_failing:
            log.warning("pod CPU use unknown this cycle (%s): estimated from request shares", read.error)
        elif not read.error and self._usage_failing:
            log.info("pod CPU use read again (%d pods)", len(read.milli))
        self._usage_failing = bool(read.error)
        if read.skipped or read.truncated:
            log.debug("pod CPU use: %d series skipped, truncated: %s", read.skipped, read.truncated)
        return read.milli

    async def close(self) -> None:
        if self.load is not None:
            await self.load.close()

    # -- status -----------------------------------------------------------------------------------
    def as_status(self, report: CycleReport) -> dict[str, Any]:
        return {
            "lastCycle": now_iso(report.at),
            "dryRun": report.dry_run,
            "outcome": report.outcome,
            "message": report.message,
            "candidates": report.candidates,
            "planned": report.planned,
            "skipped": {rule: report.skipped.get(rule, 0) for rule in REASONS},
            "moves": report.moves,
            # Every result, zeros too: kopf sends the status as a JSON merge patch, which keeps a key the
            # patch leaves out (a previous process' count would stay beside this one's).
            "totals": {result: self.totals.get(result, 0) for result in RESULTS},
            "recent": self.ledger.dump(),
        }
