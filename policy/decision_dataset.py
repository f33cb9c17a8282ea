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

Hostile input: the log is written over days from what an extender answered and what a pod watch saw,
so the reader trusts none of it. Every line is read with a length cap (:data:`MAX_LINE_BYTES`) and parsed
on its own; a line that is too long, not JSON, nested too deep, or a record whose fields have the wrong
type or an implausible value (:func:`_well_typed`) is skipped and counted, and so is a segment that
cannot be read. :class:`ReadStats` holds the counts, reported once, in one line
(:meth:`ReadStats.describe`). Only what the join and the trainer use is kept of each record
(:func:`_slim`): memory grows with the number of decisions, not with the size of their lines.

This module knows nothing about Kubernetes or kopf: the trainer imports it
(``rlsched train --from-decisions PATH``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .cluster import PodSpec
from .resources import MEMORY_MIB_LIMIT, MILLI_PER_CARD, QUANTITY_LIMIT
from .trace import MAX_CARDS_PER_NODE

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

MAX_LINE_BYTES = 4 << 20
"""The longest line read (bytes). A filter record is ~1.2 KB plus the names of the nodes kube-scheduler
kept: 5,000 nodes (Kubernetes' largest cluster) with 253-character names make ~1.3 MB. A longer line is
skipped as bad, read in pieces and never held whole: one such line must not cost the trainer its memory."""
MAX_TIME = 1e11
"""The latest plausible ``time`` or ``loggedAt`` (Unix seconds; the year 5138): far beyond any real clock,
and far enough below the trace format's bound (:data:`~rlsched.policy.resources.QUANTITY_LIMIT`) that a
creation time plus a lifetime stays readable."""
MAX_SECONDS = 10 * 365 * 86400.0
"""The longest plausible ``pendingSeconds`` or ``lifetimeSeconds``: ten years. A negative one (a clock
gone wrong) would make a pod end before it starts, which the trainer refuses for the whole trace, and
a pending time far in the past would turn one reward into millions."""
CLOCK_SKEW_S = 300.0
"""How far below zero a logged duration may be and still read as 0: the skew between the operator's
clock and the API server's that this reader forgives (NTP keeps real ones far smaller)."""
MAX_TEXT = 1024
"""The longest text field read (pod UID, namespace and name, node, scorer, model version, ...):
Kubernetes names have at most 253 characters."""
MAX_KEYS = 32
"""Entries kept of one mapping of a record (a features section, a load sample, a shadow result, a top
score): the extender writes fewer than ten."""
TOP_SCORES = 16
"""``topScores`` entries kept per decision (the extender writes five)."""
FEATURE_SECTIONS = ("pod", "node", "cluster")
"""The sections of a decision's ``features`` the extender writes, and the only ones kept."""
_REQUEST_MOST = {
    "cpuMilli": QUANTITY_LIMIT - 1,
    "memoryMiB": MEMORY_MIB_LIMIT,
    "numGpu": MAX_CARDS_PER_NODE,
    "gpuMilli": MILLI_PER_CARD,
}
"""The largest value of each field of ``features.pod`` the trace format and the simulator accept: the
quantity bound (for memory its MiB: a pod's request of at most 8 PiB, the extender's saturated one),
the cards of the largest node the extender serves, one card's milli."""


@dataclass
class ReadStats:
    """What :func:`iter_records`, :func:`load_examples` and :func:`workload` skipped; :meth:`describe`
    reports it in one line."""

    files: int = 0
    lines: int = 0
    torn_tails: int = 0
    """Segments whose last line was cut short (a crash mid-write)."""
    bad_lines: int = 0
    """Lines longer than :data:`MAX_LINE_BYTES` or that are not a JSON object (corruption, nesting too deep
    to parse), and decision and outcome records whose fields have the wrong types or implausible values
    (:func:`_well_typed`); skipped."""
    unknown_format: int = 0
    """Segments whose header names a format this reader does not know; skipped whole."""
    unreadable: int = 0
    """Segments that could not be opened or read (a dangling link, a folder named like a segment, a read
    error); skipped from where the read failed."""
    dropped_pods: int = 0
    """Pods (UIDs) logged with no usable request (:func:`workload`): left out of the trace."""
    latency_sensitive: int = 0
    """Latency-sensitive pods in the trace (:func:`workload`): the generic trace format has no QoS class,
    so the trainer sees them as ordinary pods."""

    def describe(self) -> str:
        """The counts, in one line."""
        text = (
            f"read {self.files} segments, {self.lines} lines; skipped {self.unreadable} unreadable segments, "
            f"{self.torn_tails} torn tails, {self.bad_lines} bad lines, {self.unknown_format} segments of an "
            f"unknown format, {self.dropped_pods} pods without a usable request"
        )
        if self.latency_sensitive:
            text += (
                f"; {self.latency_sensitive} latency-sensitive pods trained as ordinary ones (the trace format "
                "has no QoS class)"
            )
        return text


def segments(path: str | Path) -> list[Path]:
    """The segment files of a dataset folder (oldest first), or ``[path]`` for one file."""
    p = Path(path)
    if p.is_dir():
        return sorted(p.glob(SEGMENT_GLOB))
    if p.is_file():
        return [p]
    raise FileNotFoundError(f"decision log {p}: no such file or folder (the operator's decisionLog.path)")


def iter_records(path: str | Path, stats: ReadStats | None = None) -> Iterator[dict[str, Any]]:
    """Every valid line of the dataset, oldest first (headers included). A segment that cannot be opened
    or read (a dangling link, a folder by a segment's name, one deleted or failing mid-read) is counted
    and skipped: the others are still a dataset."""
    stats = stats if stats is not None else ReadStats()
    for seg in segments(path):
        stats.files += 1
        try:
            with open(seg, "rb") as f:
                yield from _segment_records(f, stats)
        except OSError:
            stats.unreadable += 1


def _segment_records(f: IO[bytes], stats: ReadStats) -> Iterator[dict[str, Any]]:
    """The valid lines of one open segment, read one at a time, none longer than :data:`MAX_LINE_BYTES`."""
    first = True
    while raw := f.readline(MAX_LINE_BYTES + 1):
        if not raw.endswith(b"\n"):
            if len(raw) <= MAX_LINE_BYTES:  # text after the last newline: a torn write
                stats.torn_tails += bool(raw.strip())
                return
            stats.lines += 1
            stats.bad_lines += 1
            _skip_line(f)
            continue
        if not raw.strip():
            continue
        stats.lines += 1
        obj = _parse(raw)
        if obj is None:
            stats.bad_lines += 1
            continue
        if first and obj.get("type") == "header" and obj.get("format") != FORMAT:
            stats.unknown_format += 1
            return
        first = False
        yield obj


def _skip_line(f: IO[bytes]) -> None:
    """Read past the rest of an overlong line, a piece at a time."""
    while chunk := f.readline(1 << 20):
        if chunk.endswith(b"\n"):
            return


def _parse(raw: bytes) -> dict[str, Any] | None:
    """One line as a JSON object, or None: not UTF-8, not JSON (``1e400`` reads as infinity, which the
    field checks refuse), nested deeper than the parser recurses, or not an object."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


@dataclass(slots=True)
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


@dataclass(slots=True)
class DecisionExample:
    """One filter decision joined with its outcome. Of the logged record it keeps what the join, the
    reward and the trainer read (:func:`_slim`): ``features`` holds the sections of
    :data:`FEATURE_SECTIONS`, ``scores`` and ``shadow`` their plain values."""

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
        """The pod's request in domain terms (None when the features lack it or it is invalid). Named
        ``namespace/name@uid`` with the whole UID: a recreated pod keeps its name and gets a new UID,
        and two UIDs may share any prefix, so a shortened one could name two pods alike (which the
        trace format refuses)."""
        p = (self.features or {}).get("pod") or {}
        try:
            return PodSpec(
                name=f"{self.pod}@{self.pod_uid}",
                cpu_milli=int(p["cpuMilli"]),
                memory_mib=int(p["memoryMiB"]),
                num_gpu=int(p.get("numGpu", 0)),
                gpu_milli=int(p.get("gpuMilli", 0)),
                creation_time=self.time,
                deletion_time=(
                    (self.time + self.outcome.lifetime_seconds) if self.outcome.lifetime_seconds is not None else None
                ),
                qos="LS" if p.get("latencySensitive") is True else "",
            )
        except (KeyError, TypeError, ValueError, OverflowError):
            return None


@dataclass(slots=True)
class _Observed:
    """What the outcome lines said of one pod, as :class:`Outcome` needs it: the first line of each event
    (a later one repeats it)."""

    bound: tuple[str | None, float | None] | None = None
    """``node``, ``pendingSeconds``."""
    ended: tuple[str | None, float | None, float | None] | None = None
    """``how``, ``lifetimeSeconds``, ``time``."""
    load: dict[str, float] | None = None

    def note(self, rec: Mapping[str, Any]) -> None:
        event = rec.get("event")
        if event == "bound" and self.bound is None:
            self.bound = (rec.get("node"), _duration(rec.get("pendingSeconds")))
        elif event == "ended" and self.ended is None:
            self.ended = (rec.get("how"), _duration(rec.get("lifetimeSeconds")), _num(rec.get("time")))
        elif event == "load" and self.load is None:
            self.load = _numbers(rec.get("load") or {})


def load_examples(path: str | Path, stats: ReadStats | None = None) -> list[DecisionExample]:
    """Filter decisions with their outcomes joined by pod UID, oldest first."""
    return _read(path, stats if stats is not None else ReadStats())[0]


def _read(path: str | Path, stats: ReadStats) -> tuple[list[DecisionExample], dict[str, float]]:
    """The examples (:func:`load_examples`) and the reward weights (:func:`reward_weights`), in one pass
    over the log, keeping only what they need of each line."""
    examples: list[DecisionExample] = []
    seen: set[tuple[Any, Any]] = set()
    """The (epoch, seq) of the decisions read: text or integers (:func:`_well_typed`), so hashable."""
    outcomes: dict[str, _Observed] = {}
    rebalanced: dict[str, list[float | None]] = {}
    """UID → the times of its ``rebalance`` lines that evicted it (or may have)."""
    weights = dict(REWARD_DEFAULTS)
    texts: dict[str, str] = {}
    for rec in iter_records(path, stats):
        kind = rec.get("type")
        if kind in ("policy", "header"):
            weights = _weights_of(rec, weights)
        elif kind == "rebalance":
            uid = _rebalanced_uid(rec)
            if uid is not None and len(rebalanced.setdefault(uid, [])) < 16:
                rebalanced[uid].append(_num(rec.get("time")))
        elif kind in ("decision", "outcome") and not _well_typed(rec):
            stats.bad_lines += 1
        elif kind == "decision" and rec.get("kind") == "filter" and (uid := _uid(rec)):
            epoch = rec.get("epoch")
            key = (texts.setdefault(epoch, epoch) if isinstance(epoch, str) else epoch, rec.get("seq"))
            if key[1] is not None:
                if key in seen:  # logged twice (a crash between the write and the cursor update)
                    continue
                seen.add(key)
            examples.append(_example(rec, uid, texts))
        elif kind == "outcome" and (uid := _uid(rec)):
            outcomes.setdefault(uid, _Observed()).note(rec)
    # Only the last placing decision of a pod owns its binding (earlier ones were superseded).
    last_place = {ex.pod_uid: i for i, ex in enumerate(examples) if ex.action == "place"}
    for i, ex in enumerate(examples):
        if ex.action != "place" or last_place.get(ex.pod_uid) == i:
            ex.outcome = _outcome(outcomes.get(ex.pod_uid), rebalanced.get(ex.pod_uid))
    return examples, weights


def _uid(rec: Mapping[str, Any]) -> str | None:
    """The UID of the record's pod (None when it has none)."""
    return (rec.get("pod") or {}).get("uid") or None


def _timestamp(rec: Mapping[str, Any]) -> float | None:
    """When a decision was made: its ``time`` (the extender's clock), else ``loggedAt`` (the operator's)."""
    t = _num(rec.get("time"))
    return t if t is not None else _num(rec.get("loggedAt"))


def _example(rec: Mapping[str, Any], uid: str, texts: dict[str, str]) -> DecisionExample:
    """A well-typed filter decision as an example (its outcome joined later). Names repeated across
    decisions (nodes, scorer, model version) are stored once (``texts``)."""

    def text(v: Any) -> str | None:
        return texts.setdefault(v, v) if isinstance(v, str) else None

    verdict = rec.get("verdict")
    pod = rec.get("pod") or {}
    shadow = rec.get("shadow")
    return DecisionExample(
        time=_timestamp(rec) or 0.0,  # _well_typed refused a filter decision without one
        pod_uid=uid,
        pod=f"{pod.get('namespace', '')}/{pod.get('name', '')}",
        action=verdict if verdict in ("delay", "reject") else ("place" if rec.get("node") else "none"),
        node=text(rec.get("node")),
        cards=tuple(rec.get("cards") or ()),
        features=_features(rec.get("features") or {}, texts),
        scores=[_slim(s, texts) for s in (rec.get("topScores") or [])[:TOP_SCORES] if isinstance(s, dict)],
        served_by=text(rec.get("servedBy")),
        scorer=text(rec.get("scorer")),
        model_version=text(rec.get("modelVersion")),
        mode=text(rec.get("mode")),
        shadow=_slim(shadow, texts) if isinstance(shadow, dict) else None,
        outcome=Outcome(),
    )


def _features(features: Mapping[str, Any], texts: dict[str, str]) -> dict[str, Any]:
    """The sections of a decision's ``features`` the extender writes (:data:`FEATURE_SECTIONS`), slimmed."""
    return {k: _slim(features[k], texts) for k in FEATURE_SECTIONS if isinstance(features.get(k), dict)}


def _slim(value: Mapping[str, Any], texts: dict[str, str], nested: bool = True) -> dict[str, Any]:
    """At most :data:`MAX_KEYS` entries of a record's mapping with plain values: numbers, booleans, None,
    text up to :data:`MAX_TEXT` characters, a list of card indices, and with ``nested`` one more level of
    such mappings (the chosen node's ``load``). The rest (what a newer extender adds, or garbage) is
    dropped: the examples are held in memory together, and this is what each costs. Keys and text are
    stored once (``texts``): the parser makes new ones for every line."""
    out: dict[str, Any] = {}
    for k, v in value.items():
        if len(out) >= MAX_KEYS:
            break
        if len(k) > MAX_TEXT:
            continue
        k = texts.setdefault(k, k)
        if v is None or isinstance(v, bool) or _num(v) is not None:
            out[k] = v
        elif isinstance(v, str) and len(v) <= MAX_TEXT:
            out[k] = texts.setdefault(v, v)
        elif isinstance(v, list) and _cards(v):
            out[k] = list(v)
        elif nested and isinstance(v, dict):
            out[k] = _slim(v, texts, nested=False)
    return out


def _numbers(value: Mapping[str, Any]) -> dict[str, float]:
    """At most :data:`MAX_KEYS` entries of a mapping whose values are finite numbers (a load sample)."""
    out: dict[str, float] = {}
    for k, v in value.items():
        n = _num(v)
        if n is not None:
            out[k] = n
            if len(out) >= MAX_KEYS:
                break
    return out


def _outcome(observed: _Observed | None, rebalanced: list[float | None] | None) -> Outcome:
    """A decision's outcome from its pod's outcome lines."""
    if observed is None:
        return Outcome()
    bound, ended = observed.bound, observed.ended
    return Outcome(
        bound_node=bound[0] if bound else None,
        pending_seconds=bound[1] if bound else None,
        ended=ended[0] if ended else None,
        lifetime_seconds=ended[1] if ended else None,
        load=dict(observed.load or {}),
        rebalanced=_rebalancers_eviction(rebalanced, ended),
    )


def _rebalancers_eviction(
    times: list[float | None] | None, ended: tuple[str | None, float | None, float | None] | None
) -> bool:
    """Whether the pod's end was an eviction by the rebalancer: it ended ``evicted`` within
    :data:`REBALANCE_MATCH_S` of one of its ``rebalance`` lines (``times``). Without a time on either
    line (an older log) the pair is taken as the same eviction."""
    if not times or ended is None or ended[0] != "evicted":
        return False
    end = ended[2]
    return any(t is None or end is None or abs(end - t) <= REBALANCE_MATCH_S for t in times)


def _rebalanced_uid(rec: Mapping[str, Any]) -> str | None:
    """The UID of the pod a ``rebalance`` line says the rebalancer evicted (or may have), else None: a dry
    run moved nothing, and a refused eviction (``blocked_by_pdb``, ``forbidden``, ...) left the pod where it was."""
    result = rec.get("result")
    if rec.get("dryRun") is True or not isinstance(result, str) or result not in REBALANCER_EVICTIONS:
        return None
    pod = rec.get("pod")
    uid = pod.get("uid") if isinstance(pod, dict) else None
    return uid if isinstance(uid, str) and uid and len(uid) <= MAX_TEXT else None


_OPTIONAL_TEXT = ("node", "servedBy", "scorer", "modelVersion", "mode", "verdict", "event", "how")


def _well_typed(rec: Mapping[str, Any]) -> bool:
    """Whether a decision or outcome record's fields have the types the join reads, and values a real
    cluster could have: the log holds what an extender answered, which this reader does not trust. A
    boolean is no number, a GPU count beyond :data:`~rlsched.policy.trace.MAX_CARDS_PER_NODE` no pod's,
    a negative duration or one over ten years no measurement, and a filter decision without a time cannot be
    placed in the workload (at 0 it would stretch the trace over fifty years)."""
    pod = rec.get("pod")
    if pod is not None and not (
        isinstance(pod, dict) and all(_text(pod.get(k, "")) for k in ("uid", "namespace", "name"))
    ):
        return False
    if any(rec.get(k) is not None and not _text(rec[k]) for k in _OPTIONAL_TEXT):
        return False
    if not _dedup_key(rec.get("epoch"), rec.get("seq")):
        return False
    if not all(rec.get(k) is None or _within(rec[k], MAX_TIME) for k in ("time", "loggedAt")):
        return False
    if rec.get("kind") == "filter" and _uid(rec) and _timestamp(rec) is None:
        return False
    if not all(rec.get(k) is None or _duration(rec[k]) is not None for k in ("pendingSeconds", "lifetimeSeconds")):
        return False
    if rec.get("cards") is not None and not _cards(rec["cards"]):
        return False
    if any(rec.get(k) is not None and not isinstance(rec[k], dict) for k in ("features", "shadow", "load")):
        return False
    if not _request(rec.get("features") or {}):
        return False
    return rec.get("topScores") is None or isinstance(rec["topScores"], list)


def _text(v: Any) -> bool:
    return isinstance(v, str) and len(v) <= MAX_TEXT


def _dedup_key(epoch: Any, seq: Any) -> bool:
    """Whether ``epoch`` and ``seq`` can identify a record (text or integers, or absent)."""
    return (epoch is None or _text(epoch) or _integer(epoch)) and (seq is None or _integer(seq))


def _duration(v: Any) -> float | None:
    """A ``pendingSeconds`` or ``lifetimeSeconds`` as logged, or None when it is not plausible. The
    operator subtracts an API-server timestamp from its own clock, so skew can make a short one
    slightly negative: down to ``-CLOCK_SKEW_S`` it reads as 0 (an eviction a second after creation
    is still an eviction); further below, or above MAX_SECONDS, it is refused."""
    n = _num(v)
    if n is None or not -CLOCK_SKEW_S <= n <= MAX_SECONDS:
        return None
    return max(n, 0.0)


def _within(v: Any, most: float) -> bool:
    """Whether ``v`` is a number (not a boolean) from 0 to ``most``."""
    n = _num(v)
    return n is not None and 0.0 <= n <= most


def _integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _cards(v: Any) -> bool:
    """Whether ``v`` is a list of card indices of one node."""
    return (
        isinstance(v, list)
        and len(v) <= MAX_CARDS_PER_NODE
        and all(_integer(c) and 0 <= c < MAX_CARDS_PER_NODE for c in v)
    )


def _request(features: Mapping[str, Any]) -> bool:
    """Whether a decision's ``features.pod`` (the request, absent or a mapping) is one the trace format and
    the simulator accept field by field: integers from 0 to :data:`_REQUEST_MOST`, never booleans or
    text (``int()`` would read ``true`` as 1 and ``"4000"`` as 4000), a boolean ``latencySensitive``."""
    pod = features.get("pod")
    if pod is None:
        return True
    if not isinstance(pod, dict):
        return False
    for key, most in _REQUEST_MOST.items():
        v = pod.get(key)
        if v is not None and not (_integer(v) and 0 <= v <= most):
            return False
    return pod.get("latencySensitive") is None or isinstance(pod["latencySensitive"], bool)


def _num(v: Any) -> float | None:
    """``v`` as a finite float, or None: not a number, a boolean, infinite or NaN (the parser reads ``1e400``
    as infinity), or an integer too large for a float (which ``math.isfinite`` would raise on)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _weights_of(rec: Mapping[str, Any], weights: dict[str, float]) -> dict[str, float]:
    """The reward weights from a ``policy`` line or segment header that names them (its numbers over the
    CRD defaults), else ``weights`` (the newest so far)."""
    named = rec.get("rewardWeights")
    if not isinstance(named, dict):
        return weights
    return {**REWARD_DEFAULTS, **{k: float(v) for k in REWARD_DEFAULTS if (v := _num(named.get(k))) is not None}}


def reward_weights(path: str | Path) -> dict[str, float]:
    """The newest ``rewardWeights`` in the dataset (``policy`` lines, written at each rollout, and
    segment headers); the CRD defaults for the weights it does not name."""
    weights = dict(REWARD_DEFAULTS)
    for rec in iter_records(path):
        if rec.get("type") in ("policy", "header"):
            weights = _weights_of(rec, weights)
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


def workload(examples: Iterable[DecisionExample], stats: ReadStats | None = None) -> list[PodSpec]:
    """The observed pods, one per UID in arrival order — a trace to fine-tune a policy on in the
    simulator (the workload the cluster actually sees, rather than the one it was trained on).

    A pod none of whose decisions holds a usable request, or whose name another pod already has (only a
    crafted log: names end in the UID), is left out and counted in ``stats`` (``dropped_pods``), and so
    are the latency-sensitive pods kept (``latency_sensitive``; the trace has no QoS class)."""
    seen: set[str] = set()
    names: set[str] = set()
    unusable: set[str] = set()
    pods: list[PodSpec] = []
    for ex in examples:
        if ex.pod_uid in seen:
            continue
        spec = ex.pod_spec()
        if spec is None or spec.name in names:
            unusable.add(ex.pod_uid)
            continue
        seen.add(ex.pod_uid)
        names.add(spec.name)
        pods.append(spec)
    if stats is not None:
        stats.dropped_pods += len(unusable - seen)
        stats.latency_sensitive += sum(p.qos == "LS" for p in pods)
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
            self.stats.describe(),
        ]


def summarize(
    path: str | Path, weights: Mapping[str, float] | None = None
) -> tuple[list[DecisionExample], DatasetSummary]:
    """Load the dataset and count what is in it (one pass over the log: the reward weights come with the
    examples)."""
    stats = ReadStats()
    examples, w = _read(path, stats)
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
    dataset (counts, mean reward of the logged placements under its reward weights, what was skipped).
    The generic format has no QoS class: latency-sensitive pods are written, and trained on, as ordinary
    pods (counted in the summary). Raises ValueError, saying what was skipped, when the log holds fewer
    than ``min_pods`` usable pods.
    """
    from .trace import dump_generic

    examples, summary = summarize(path)
    pods = workload(examples, summary.stats)
    del examples
    if len(pods) < min_pods:
        raise ValueError(
            f"{path}: {len(pods)} pods with a readable request in the decision log; need at least {min_pods} "
            f"({summary.stats.describe()})"
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
            qos=p.qos,
        )
        for p in pods
    ]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "decisions-workload.json"
    trace.write_text(dump_generic([], pods), encoding="utf-8")
    return trace, summary
