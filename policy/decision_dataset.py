"""The decision dataset: reading what ``rlsched operator`` logs, as training examples.

The operator (``rlsched.operator.decisionlog``) writes a folder of JSON Lines *segments*
(``segment-<unix ms>-<n>.jsonl``, oldest first by name). Every line is one object with a ``type``:

- ``header`` — first line of each segment: ``format`` (:data:`FORMAT`), ``created``, ``policy``,
  ``rewardWeights`` and ``objective`` (the served SchedulingPolicy's ``spec.rewardWeights`` and every
  field of its ``spec.objective``, at the time).
- ``decision`` — one record of the extender's decision ring, verbatim, plus ``epoch`` (the extender
  process) and ``loggedAt``. ``kind`` is ``filter`` (the decision: ``pod``, ``node``, ``cards``,
  ``features``, ``topScores``, ``servedBy``, ``scorer``, ``modelVersion``, ``mode``, ``shadow``, or a
  ``verdict`` ``delay``/``reject`` with ``reason`` and ``retryAfterSeconds``) or ``bind``.
- ``outcome`` — what happened to a pod later, observed from the pod watch: ``event`` ``bound``
  (``node``, ``pendingSeconds``), ``ended`` (``how``: ``evicted`` | ``preempted`` | ``deleted`` |
  ``succeeded`` | ``failed``; ``lifetimeSeconds``) or ``load`` (``node``, ``load``: {cpu, memory, …}
  sampled some time after binding).
- ``policy`` — a rollout of the served SchedulingPolicy: ``generation``, ``mode``, ``modelVersion``,
  ``ok`` and ``reason``, and its ``rewardWeights`` and ``objective`` (which hold from that line on).
- ``gap`` — ``dropped`` ring records the operator never saw (the ring overflowed between drains).
- ``rebalance`` — a move of the operator's rebalancer: ``pod``, ``owner``, ``from``, ``to``,
  ``reason``, ``gain``, ``result``, ``dryRun``, ``time``. A pod it evicted (``result`` ``evicted``, or
  ``unknown``: the answer was lost, so it may have been) and that ended ``evicted`` within
  :data:`REBALANCE_MATCH_S` of the line is marked :attr:`Outcome.rebalanced`: that eviction was the
  rebalancer's choice, not a consequence of where the pod was placed, so :func:`reward` does not
  charge it to the placing decision. An eviction long after it (the kubelet's, under node pressure,
  hours after a lost answer) is not the rebalancer's and is charged.

Crash safety: the writer appends whole lines and fsyncs; a crash can leave at most a torn last line,
which :func:`iter_records` skips (as it skips, and counts, any line that is not a JSON object).
Outcomes join decisions by pod UID (:func:`load_examples`); an outcome whose decision was rotated
away is dropped.

This module knows nothing about Kubernetes or kopf: the trainer imports it
(``rlsched train --from-decisions PATH``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cluster import PodSpec

FORMAT = "rlsched.decisions/v1"
"""``format`` of the segment headers this reader understands."""

SEGMENT_GLOB = "segment-*.jsonl"

REBALANCER_EVICTIONS = frozenset({"evicted", "unknown"})
"""``result`` of a ``rebalance`` line whose pod the rebalancer evicted, or may have (its answer was lost)."""
REBALANCE_MATCH_S = 600.0
"""How far apart (seconds, the operator's clock for both) a ``rebalance`` line and the pod's ``ended``
``evicted`` outcome may be for that eviction to be the rebalancer's. The outcome is logged when the
watch shows the eviction, seconds after the Eviction API call (before or after the ``rebalance`` line,
which is written once the call has answered); minutes allow for a slow watch."""

REWARD_DEFAULTS: dict[str, float] = {"placed": 1.0, "pendingSeconds": 0.01, "evicted": 5.0, "nodeLoad": 0.5}
"""The SchedulingPolicy CRD's defaults for ``spec.rewardWeights``."""


@dataclass
class ReadStats:
    """What :func:`iter_records` skipped."""

    files: int = 0
    lines: int = 0
    torn_tails: int = 0
    """Segments whose last line was cut short (a crash mid-write)."""
    bad_lines: int = 0
    """Lines that are not a JSON object (corruption), or decision and outcome records whose fields
    have the wrong types (:func:`load_examples`); skipped."""
    unknown_format: int = 0
    """Segments whose header names a format this reader does not know; skipped whole."""


def segments(path: str | Path) -> list[Path]:
    """The segment files of a dataset folder (oldest first), or ``[path]`` for one file."""
    p = Path(path)
    if p.is_dir():
        return sorted(p.glob(SEGMENT_GLOB))
    if p.is_file():
        return [p]
    raise FileNotFoundError(f"decision log {p}: no such file or folder (the operator's decisionLog.path)")


def iter_records(path: str | Path, stats: ReadStats | None = None) -> Iterator[dict[str, Any]]:
    """Every valid line of the dataset, oldest first (headers included)."""
    stats = stats if stats is not None else ReadStats()
    for seg in segments(path):
        stats.files += 1
        data = seg.read_bytes()
        lines = data.split(b"\n")
        torn = lines.pop() if lines else b""  # text after the last newline: a torn write
        if torn.strip():
            stats.torn_tails += 1
        first = True
        for raw in lines:
            if not raw.strip():
                continue
            stats.lines += 1
            try:
                obj = json.loads(raw)
            except ValueError:
                stats.bad_lines += 1
                continue
            if not isinstance(obj, dict):
                stats.bad_lines += 1
                continue
            if first and obj.get("type") == "header" and obj.get("format") != FORMAT:
                stats.unknown_format += 1
                break
            first = False
            yield obj


@dataclass
class Outcome:
    """What became of the pod after the decision."""

    bound_node: str | None = None
    pending_seconds: float | None = None
    """Creation → binding (for the placing decision; for a delay, creation → eventual binding)."""
    ended: str | None = None
    """``evicted`` | ``preempted`` | ``deleted`` | ``succeeded`` | ``failed`` (None: still running, or unknown)."""
    lifetime_seconds: float | None = None
    load: dict[str, float] = field(default_factory=dict)
    """Load of the bound node some time after binding (0..1 per column)."""
    rebalanced: bool = False
    """The pod's ``ended`` ``evicted`` was the rebalancer's move (a ``rebalance`` line with ``result`` in
    :data:`REBALANCER_EVICTIONS`, not a dry run, within :data:`REBALANCE_MATCH_S` of it), not the
    placement's fault (:func:`reward`)."""


@dataclass
class DecisionExample:
    """One filter decision joined with its outcome."""

    time: float
    pod_uid: str
    pod: str
    """``namespace/name``."""
    action: str
    """``place`` | ``delay`` | ``reject`` | ``none`` (no node fitted)."""
    node: str | None
    cards: tuple[int, ...]
    features: dict[str, Any]
    scores: list[dict[str, Any]]
    """``topScores``: the best nodes and the serving scorer's values."""
    served_by: str | None
    scorer: str | None
    model_version: str | None
    mode: str | None
    shadow: dict[str, Any] | None
    outcome: Outcome

    @property
    def followed(self) -> bool | None:
        """Was the pod bound where this decision said (None: not bound, or not a placement)?"""
        if self.action != "place" or self.outcome.bound_node is None:
            return None
        return self.outcome.bound_node == self.node

    def pod_spec(self) -> PodSpec | None:
        """The pod's request in domain terms (None when the features lack it or it is invalid)."""
        p = (self.features or {}).get("pod") or {}
        try:
            return PodSpec(
                name=f"{self.pod}@{self.pod_uid[:8]}",
                cpu_milli=int(p["cpuMilli"]),
                memory_mib=int(p["memoryMiB"]),
                num_gpu=int(p.get("numGpu", 0)),
                gpu_milli=int(p.get("gpuMilli", 0)),
                creation_time=self.time,
                deletion_time=(self.time + self.outcome.lifetime_seconds) if self.outcome.lifetime_seconds else None,
                qos="LS" if p.get("latencySensitive") is True else "",
            )
        except (KeyError, TypeError, ValueError):
            return None


def load_examples(path: str | Path, stats: ReadStats | None = None) -> list[DecisionExample]:
    """Filter decisions with their outcomes joined by pod UID, oldest first."""
    decisions: list[dict[str, Any]] = []
    seen: set[tuple[Any, Any]] = set()
    outcomes: dict[str, dict[str, dict[str, Any]]] = {}
    rebalanced: dict[str, list[float | None]] = {}
    """UID → the times of its ``rebalance`` lines that evicted it (or may have)."""
    for rec in iter_records(path, stats):
        kind = rec.get("type")
        if kind == "rebalance":
            uid = _rebalanced_uid(rec)
            if uid is not None and len(rebalanced.setdefault(uid, [])) < 16:
                rebalanced[uid].append(_num(rec.get("time")))
            continue
        if kind in ("decision", "outcome") and not _well_typed(rec):
            if stats is not None:
                stats.bad_lines += 1
            continue
        if kind == "decision" and rec.get("kind") == "filter":
            uid = (rec.get("pod") or {}).get("uid")
            if not uid:
                continue
            key = (rec.get("epoch"), rec.get("seq"))
            if key[1] is not None:
                if key in seen:  # logged twice (a crash between the write and the cursor update)
                    continue
                seen.add(key)
            decisions.append(rec)
        elif kind == "outcome":
            uid = (rec.get("pod") or {}).get("uid")
            if uid:
                outcomes.setdefault(uid, {}).setdefault(str(rec.get("event")), rec)
    out: list[DecisionExample] = []
    for rec in decisions:
        uid = rec["pod"]["uid"]
        o = outcomes.get(uid, {})
        bound, ended, load = o.get("bound"), o.get("ended"), o.get("load")
        outcome = Outcome(
            bound_node=bound.get("node") if bound else None,
            pending_seconds=_num(bound.get("pendingSeconds")) if bound else None,
            ended=ended.get("how") if ended else None,
            lifetime_seconds=_num(ended.get("lifetimeSeconds")) if ended else None,
            load={k: float(v) for k, v in ((load or {}).get("load") or {}).items() if _num(v) is not None},
            rebalanced=_rebalancers_eviction(rebalanced.get(uid), ended),
        )
        verdict = rec.get("verdict")
        action = verdict if verdict in ("delay", "reject") else ("place" if rec.get("node") else "none")
        pod = rec.get("pod") or {}
        out.append(
            DecisionExample(
                time=float(rec.get("time") or rec.get("loggedAt") or 0.0),
                pod_uid=uid,
                pod=f"{pod.get('namespace', '')}/{pod.get('name', '')}",
                action=action,
                node=rec.get("node"),
                cards=tuple(int(c) for c in rec.get("cards") or ()),
                features=rec.get("features") or {},
                scores=list(rec.get("topScores") or []),
                served_by=rec.get("servedBy"),
                scorer=rec.get("scorer"),
                model_version=rec.get("modelVersion"),
                mode=rec.get("mode"),
                shadow=rec.get("shadow"),
                outcome=outcome,
            )
        )
    # Only the last placing decision of a pod owns its binding (earlier ones were superseded).
    last_place: dict[str, int] = {}
    for i, ex in enumerate(out):
        if ex.action == "place":
            last_place[ex.pod_uid] = i
    for i, ex in enumerate(out):
        if ex.action == "place" and last_place.get(ex.pod_uid) != i:
            ex.outcome = Outcome()
    return out


def _rebalancers_eviction(times: list[float | None] | None, ended: Mapping[str, Any] | None) -> bool:
    """Whether the pod's end was an eviction by the rebalancer: it ended ``evicted`` within
    :data:`REBALANCE_MATCH_S` of one of its ``rebalance`` lines (``times``). Without a time on either
    line (an older log) the pair is taken as the same eviction."""
    if not times or ended is None or ended.get("how") != "evicted":
        return False
    end = _num(ended.get("time"))
    return any(t is None or end is None or abs(end - t) <= REBALANCE_MATCH_S for t in times)


def _rebalanced_uid(rec: Mapping[str, Any]) -> str | None:
    """The UID of the pod a ``rebalance`` line says the rebalancer evicted (or may have), else None: a dry
    run moved nothing, and a refused eviction (``blocked_by_pdb``, ``forbidden``, ...) left the pod where it was."""
    result = rec.get("result")
    if rec.get("dryRun") is True or not isinstance(result, str) or result not in REBALANCER_EVICTIONS:
        return None
    pod = rec.get("pod")
    uid = pod.get("uid") if isinstance(pod, dict) else None
    return uid if isinstance(uid, str) and uid else None


_OPTIONAL_TEXT = ("node", "servedBy", "scorer", "modelVersion", "mode", "verdict", "event", "how")


def _well_typed(rec: Mapping[str, Any]) -> bool:
    """Whether a decision or outcome record's fields have the types the join reads: the log holds
    what an extender answered, which this reader does not trust."""
    pod = rec.get("pod")
    if pod is not None and not (
        isinstance(pod, dict) and all(isinstance(pod.get(k, ""), str) for k in ("uid", "namespace", "name"))
    ):
        return False
    if any(rec.get(k) is not None and not isinstance(rec[k], str) for k in _OPTIONAL_TEXT):
        return False
    for k in ("time", "loggedAt"):
        if rec.get(k) is not None and _num(rec[k]) is None:
            return False
    cards = rec.get("cards")
    if cards is not None and not (
        isinstance(cards, list) and all(isinstance(c, int) and not isinstance(c, bool) for c in cards)
    ):
        return False
    for k in ("features", "shadow", "load"):
        if rec.get(k) is not None and not isinstance(rec[k], dict):
            return False
    return rec.get("topScores") is None or isinstance(rec["topScores"], list)


def _num(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def reward_weights(path: str | Path) -> dict[str, float]:
    """The newest ``rewardWeights`` in the dataset (``policy`` lines, written at each rollout, and
    segment headers); the CRD defaults for the weights it does not name."""
    weights = dict(REWARD_DEFAULTS)
    newest: dict[str, Any] | None = None
    for rec in iter_records(path):
        if rec.get("type") in ("policy", "header") and isinstance(rec.get("rewardWeights"), dict):
            newest = rec["rewardWeights"]
    if newest:
        weights.update({k: float(v) for k, v in newest.items() if k in weights and _num(v) is not None})
    return weights


def reward(example: DecisionExample, weights: Mapping[str, float] | None = None) -> float:
    """The reward of one placing decision from its observed outcome.

    ``placed`` if the pod was bound where the decision said, minus ``pendingSeconds`` × the time it
    waited, minus ``evicted`` if it was evicted or preempted, minus ``nodeLoad`` × the mean load of
    the node afterwards. Decisions without an observed binding score 0 (nothing known yet).

    A pod the rebalancer evicted (:attr:`Outcome.rebalanced`, ended ``evicted``) is not charged
    ``evicted``: the rebalancer chose to move it (the operator's ``rebalance`` line says so), and
    charging the placement would teach the policy to avoid the placements the rebalancer improves on.
    It gets what a pod that ran until it was moved gets: the placed, waiting and load terms only.
    A preemption of such a pod is still charged (the rebalancer does not preempt).
    """
    w = dict(REWARD_DEFAULTS)
    w.update(weights or {})
    o = example.outcome
    if o.bound_node is None:
        return 0.0
    r = w["placed"] if example.followed else 0.0
    r -= w["pendingSeconds"] * (o.pending_seconds or 0.0)
    if o.ended in ("evicted", "preempted") and not _moved(o):
        r -= w["evicted"]
    if o.load:
        r -= w["nodeLoad"] * (sum(o.load.values()) / len(o.load))
    return r


def _moved(outcome: Outcome) -> bool:
    """Whether the pod's end was the rebalancer's eviction (:attr:`Outcome.rebalanced`)."""
    return outcome.ended == "evicted" and outcome.rebalanced


def workload(examples: Iterable[DecisionExample]) -> list[PodSpec]:
    """The observed pods, one per UID in arrival order — a trace to fine-tune a policy on in the
    simulator (the workload the cluster actually sees, rather than the one it was trained on)."""
    seen: set[str] = set()
    pods: list[PodSpec] = []
    for ex in examples:
        if ex.pod_uid in seen:
            continue
        spec = ex.pod_spec()
        if spec is not None:
            seen.add(ex.pod_uid)
            pods.append(spec)
    return pods


@dataclass
class DatasetSummary:
    """What ``rlsched train --from-decisions`` prints before it trains."""

    examples: int
    placements: int
    delays: int
    rejects: int
    bound: int
    followed: int
    evicted: int
    """Placements whose pod was evicted or preempted for cause (charged by :func:`reward`)."""
    mean_reward: float
    model_versions: dict[str, int]
    stats: ReadStats
    rebalanced: int = 0
    """Placements whose pod the rebalancer evicted (not charged; not in :attr:`evicted`)."""

    def lines(self) -> list[str]:
        return [
            f"{self.examples} decisions ({self.placements} placements, {self.delays} delays, {self.rejects} rejects); "
            f"{self.bound} bound, {self.followed} where the policy said, {self.evicted} evicted or preempted, "
            f"{self.rebalanced} moved by the rebalancer",
            f"mean reward {self.mean_reward:.4f}; model versions: "
            + (", ".join(f"{k} ({v})" for k, v in sorted(self.model_versions.items())) or "none"),
            f"read {self.stats.files} segments, {self.stats.lines} lines; skipped {self.stats.torn_tails} torn tails, "
            f"{self.stats.bad_lines} bad lines, {self.stats.unknown_format} segments of an unknown format",
        ]


def summarize(
    path: str | Path, weights: Mapping[str, float] | None = None
) -> tuple[list[DecisionExample], DatasetSummary]:
    """Load the dataset and count what is in it."""
    stats = ReadStats()
    examples = load_examples(path, stats)
    w = dict(reward_weights(path))
    w.update(weights or {})
    places = [e for e in examples if e.action == "place"]
    versions: dict[str, int] = {}
    for e in examples:
        versions[e.model_version or "none"] = versions.get(e.model_version or "none", 0) + 1
    rewards = [reward(e, w) for e in places if e.outcome.bound_node is not None]
    return examples, DatasetSummary(
        examples=len(examples),
        placements=len(places),
        delays=sum(e.action == "delay" for e in examples),
        rejects=sum(e.action == "reject" for e in examples),
        bound=sum(e.outcome.bound_node is not None for e in places),
        followed=sum(bool(e.followed) for e in places),
        evicted=sum(e.outcome.ended in ("evicted", "preempted") and not _moved(e.outcome) for e in places),
        rebalanced=sum(_moved(e.outcome) for e in places),
        mean_reward=sum(rewards) / len(rewards) if rewards else 0.0,
        model_versions=versions,
        stats=stats,
    )


def prepare_fine_tune(path: str | Path, out_dir: str | Path, min_pods: int = 1) -> tuple[Path, DatasetSummary]:
    """The seam ``rlsched train --from-decisions PATH`` calls: the observed workload as a pod list.

    Writes ``<out_dir>/decisions-workload.json`` (the generic trace format, times relative to the
    first pod) for the trainer's ``traces``; with ``--init-model`` (the served model) PPO then
    fine-tunes on the workload the cluster actually sees. Returns the file and a summary of the
    dataset (counts, mean reward of the logged placements under its reward weights).
    Raises ValueError when the log holds fewer than ``min_pods`` usable pods.
    """
    from .trace import dump_generic

    examples, summary = summarize(path)
    pods = workload(examples)
    if len(pods) < min_pods:
        raise ValueError(
            f"{path}: {len(pods)} pods with a readable request in the decision log; need at least {min_pods}"
        )
    t0 = min(p.creation_time or 0.0 for p in pods)
    pods = [
        PodSpec(
            name=p.name,
            cpu_milli=p.cpu_milli,
            memory_mib=p.memory_mib,
            num_gpu=p.num_gpu,
            gpu_milli=p.gpu_milli,
            gpu_models=p.gpu_models,
            creation_time=None if p.creation_time is None else round(p.creation_time - t0, 3),
            deletion_time=None if p.deletion_time is None else round(p.deletion_time - t0, 3),
        )
        for p in pods
    ]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "decisions-workload.json"
    trace.write_text(dump_generic([], pods), encoding="utf-8")
    return trace, summary
