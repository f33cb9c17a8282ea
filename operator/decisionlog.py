"""The decision log: an append-only, size-bounded, crash-safe JSON Lines dataset on a volume.

Three parts (the format and its reader live in :mod:`rlsched.policy.decision_dataset`, with the trainer):

- :class:`DecisionLog` appends lines to the newest segment, fsyncs each batch, starts a new segment
  at ``segmentBytes`` and deletes the oldest segments beyond ``maxBytes``. On open it cuts a torn
  last line left by a crash, so appends never glue onto half a line. Segments are named by the time
  they start, and every name sorts after the existing ones whatever the clock does (a step back).
- :class:`Drainer` pulls the extender's ring (``GET /decisions?after=<cursor>``) every
  ``drainIntervalS``, logs each record, hands ``delay``/``reject`` verdicts and ``room`` records to
  the listeners (the requeuer) and persists the cursor (``cursor.json``) *after* the fsync — at-least-once; the reader
  drops duplicates by (epoch, seq). A changed extender ``epoch`` (restart) starts from 0. The records
  are encoded, appended, fsync'd and the cursor saved in worker threads, and the cursor only when it
  moved: a slow volume must not stall kopf's event loop every ``drainIntervalS``.
- :class:`OutcomeTracker` turns pod watch events into ``outcome`` lines: ``bound`` (node, pending
  time), ``ended`` (evicted / preempted / deleted / succeeded / failed, lifetime) and ``load`` (the
  node's load ``loadDelayS`` after binding, from Prometheus when configured).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import math
import os
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from rlsched.extender.bounded_read import AnswerTooLong, read_capped
from rlsched.extender.rejections import describe
from rlsched.policy.decision_dataset import FORMAT, SEGMENT_GLOB

from .extender_client import ExtenderClient, ExtenderUnavailable
from .log_once import LogOnce
from .sink import fsync_dir

log = logging.getLogger("rlsched.operator.decisions")

CURSOR_FILE = "cursor.json"
DISPATCH_EPOCHS = 8
"""Rings (extender processes: restarts, replicas) whose dispatched position is remembered."""
_SEGMENT_NAME = re.compile(r"segment-(\d{13})-\d+\.jsonl")
"""What :meth:`DecisionLog._rotate` names a segment: ``segment-<unix ms, 13 digits>-<n>.jsonl``."""


def _dumps(obj: Mapping[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), default=str, allow_nan=False).encode() + b"\n"


def _encode_decisions(
    head: list[dict[str, Any]], received: list[Any], epoch: str, now: float
) -> tuple[list[dict[str, Any]], list[bytes], Any, int]:
    """``head`` (the drainer's own lines) and the ring's records as ``decision`` lines: (the records that
    are JSON objects JSON can write, all the lines, the first of the other records or None, how many
    others). The extender's JSON may hold NaN or 1e400 (Python's parser reads them), which one line
    would otherwise turn into a failed batch, retried forever. Run in a worker thread: a page of
    records can be megabytes of JSON."""
    records: list[dict[str, Any]] = []
    lines = [_dumps(h) for h in head]
    first_bad: Any = None
    bad = 0
    for rec in received:
        try:
            if not isinstance(rec, dict):
                raise TypeError("not a JSON object")
            line = _dumps({"type": "decision", "epoch": epoch, "loggedAt": now, **rec})
        except (ValueError, TypeError, RecursionError):
            first_bad = rec if bad == 0 else first_bad
            bad += 1
            continue
        records.append(rec)
        lines.append(line)
    return records, lines, first_bad, bad


class CursorNotSaved(OSError):
    """The lines were appended and fsync'd, but ``cursor.json`` could not be written."""


class DecisionLog:
    """Append-only segments under ``directory`` (module docstring)."""

    def __init__(
        self,
        directory: str | Path,
        segment_bytes: int = 16 << 20,
        max_bytes: int = 512 << 20,
        fsync: bool = True,
        header: Callable[[], Mapping[str, Any]] | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.directory = Path(directory)
        self.segment_bytes, self.max_bytes, self.fsync = segment_bytes, max_bytes, fsync
        self.header = header or (lambda: {})
        self.clock = clock
        self._file: Any = None
        self._path: Path | None = None
        self._size = 0
        self._counter = 0
        self.lines_written = 0
        self.segments_deleted = 0
        self._lock = asyncio.Lock()

    # -- segments -----------------------------------------------------------------------------------
    def open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        existing = sorted(self.directory.glob(SEGMENT_GLOB))
        if existing and existing[-1].stat().st_size < self.segment_bytes:
            self._repair(existing[-1])
            self._path = existing[-1]
            self._file = open(self._path, "ab")
            self._size = self._path.stat().st_size
        else:
            self._rotate()

    @staticmethod
    def _repair(path: Path) -> None:
        """Cut a torn last line (no newline at the end: the process died mid-write)."""
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            with open(path, "r+b") as f:
                f.truncate(keep)
                f.flush()
                os.fsync(f.fileno())
            log.warning("decision log %s: cut a torn last line (%d bytes)", path.name, len(data) - keep)

    def _rotate(self) -> None:
        if self._file is not None:
            self._file.close()
        self._counter += 1
        name = f"segment-{self._next_ms():013d}-{self._counter:06d}.jsonl"
        self._path = self.directory / name
        self._file = open(self._path, "ab")
        header = {"type": "header", "format": FORMAT, "created": round(self.clock(), 3), **self.header()}
        data = _dumps(header)
        self._file.write(data)
        self._size = len(data)
        self._sync(directory=True)
        self._enforce_bound()

    def _next_ms(self) -> int:
        """The new segment's name time: the clock's milliseconds, or one after the newest segment's
        when the clock is not past it. Segments are ordered by name — this writer deletes the first
        ones past ``maxBytes``, appends to the last one after a restart, and the reader reads them in
        that order —, so a name must sort after every existing one: with the wall clock alone, a clock
        stepped back (NTP) named new segments before the old ones, and the bound deleted the newest
        decisions first. The name is then a little later than the segment's start; its header keeps
        the clock's own ``created``."""
        newest = max(
            (int(m.group(1)) for p in self.directory.glob(SEGMENT_GLOB) if (m := _SEGMENT_NAME.fullmatch(p.name))),
            default=-1,
        )
        return max(int(self.clock() * 1000), newest + 1)

    def _enforce_bound(self) -> None:
        segs = sorted(self.directory.glob(SEGMENT_GLOB))
        sizes = {s: s.stat().st_size for s in segs}
        total = sum(sizes.values())
        for s in segs:
            if total <= self.max_bytes or s == self._path:
                break
            s.unlink(missing_ok=True)
            total -= sizes[s]
            self.segments_deleted += 1
            log.info(
                "decision log: deleted the oldest segment %s (%d bytes) to stay under %d bytes",
                s.name,
                sizes[s],
                self.max_bytes,
            )
        if self.fsync:
            fsync_dir(self.directory)

    def _sync(self, directory: bool = False) -> None:
        self._file.flush()
        if self.fsync:
            os.fsync(self._file.fileno())
            if directory:
                fsync_dir(self.directory)

    # -- writing ------------------------------------------------------------------------------------
    def append(self, records: Iterable[Mapping[str, Any]]) -> int:
        """Append records (one line each) and fsync; returns how many were written."""
        return self.append_lines([_dumps(r) for r in records])

    def append_lines(self, lines: Sequence[bytes]) -> int:
        """Append encoded lines (:func:`_dumps`) and fsync; returns how many were written."""
        if self._file is None:
            self.open()
        if not lines:
            return 0
        for line in lines:
            if self._size >= self.segment_bytes:
                self._sync()
                self._rotate()
            self._file.write(line)
            self._size += len(line)
        self._sync()
        self.lines_written += len(lines)
        return len(lines)

    async def awrite(self, records: Iterable[Mapping[str, Any]]) -> int:
        """:meth:`append` off the event loop, one writer at a time (the drainer and the tracker share it)."""
        records = list(records)
        async with self._lock:
            return await asyncio.to_thread(self.append, records)

    def commit(self, lines: Sequence[bytes], cursor: Mapping[str, Any] | None) -> int:
        """Append ``lines`` (fsync'd), then save ``cursor`` (None: it did not move); :class:`CursorNotSaved`
        when only the cursor failed."""
        written = self.append_lines(lines)
        if cursor is not None:
            try:
                self.save_cursor(cursor)
            except OSError as exc:
                raise CursorNotSaved(
                    exc.errno, f"cannot save the decision log's {CURSOR_FILE}: {exc.strerror or exc}"
                ) from exc
        return written

    async def acommit(self, lines: Sequence[bytes], cursor: Mapping[str, Any] | None) -> int:
        """:meth:`commit` off the event loop, under the writers' lock (the drainer's whole write)."""
        lines = list(lines)
        async with self._lock:
            return await asyncio.to_thread(self.commit, lines, cursor)

    def total_bytes(self) -> int:
        return sum(s.stat().st_size for s in self.directory.glob(SEGMENT_GLOB))

    def close(self) -> None:
        if self._file is not None:
            self._sync()
            self._file.close()
            self._file = None

    # -- cursor -------------------------------------------------------------------------------------
    def load_cursor(self) -> dict[str, Any]:
        try:
            data = json.loads((self.directory / CURSOR_FILE).read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def save_cursor(self, cursor: Mapping[str, Any]) -> None:
        path = self.directory / CURSOR_FILE
        tmp = path.with_name(f".{CURSOR_FILE}.tmp")
        with open(tmp, "w") as f:
            json.dump(dict(cursor), f)
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)


VerdictListener = Callable[[Mapping[str, Any]], None]


def _count(body: Mapping[str, Any], key: str, default: int) -> int:
    """A ``/decisions`` answer's count field (absent or 0: ``default``); ValueError when it is not one."""
    value = body.get(key)
    if not value:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{key!r} is not a count: {value!r:.100}")
    try:
        count = int(value)
    except ValueError:
        raise ValueError(f"{key!r} is not a count: {value!r:.100}") from None
    if count < 0:
        raise ValueError(f"{key!r} is negative: {count}")
    return count


class Drainer:
    """Moves the extender's decision ring into the log (module docstring)."""

    def __init__(
        self,
        client: ExtenderClient,
        log_: DecisionLog | None,
        listeners: Iterable[VerdictListener] = (),
        interval_s: float = 2.0,
        limit: int = 1000,
        clock: Callable[[], float] = time.time,
    ):
        self.client, self.log = client, log_
        self.listeners = list(listeners)
        self.interval_s, self.limit, self.clock = interval_s, limit, clock
        cursor = log_.load_cursor() if log_ is not None else {}
        try:
            self.next: int = _count(cursor, "next", 0)
        except ValueError as exc:  # a cursor edited by hand: read the ring from the start (at-least-once)
            log.warning("ignoring %s in the decision log's %s: reading the ring from the start", exc, CURSOR_FILE)
            cursor = {}
            self.next = 0
        epoch = cursor.get("epoch")
        self.epoch: str | None = epoch if isinstance(epoch, str) else None
        self._saved: tuple[str | None, int] = (self.epoch, self.next)
        """The cursor ``cursor.json`` holds: an unchanged one is not written again."""
        self.drained = 0
        self.dropped = 0
        self.skipped = 0
        """Records that were not JSON objects, or that JSON cannot write (NaN, infinities): skipped,
        and the cursor moves past them."""
        self.bad_answers = 0
        """Answers whose ``next``/``last``/``dropped`` was not a count (the poll fails, as if unavailable)."""
        self.last_error: str | None = None
        self.write_failed = 0
        """Polls whose records or cursor could not be written to the log (a full disk, say)."""
        self._once = LogOnce(log, 100).log
        self._write_errors = LogOnce(log, 100)
        """Write failures, logged once per kind of error until a write succeeds again."""
        self._dispatched: OrderedDict[str, int] = OrderedDict()
        """Per ring (epoch), the position up to which the listeners were called (in this process): the
        last :data:`DISPATCH_EPOCHS` rings. One position for the last ring only was not enough: with two
        scheduler replicas the Service answers from either extender, and each switch back to the other
        ring called the listeners for all its records again (a requeue and an event per switch)."""

    def _dispatch(self, epoch: str, records: list[dict[str, Any]], next_: int) -> None:
        """Delay, reject and room records to the listeners, each once (by epoch and ``seq``)."""
        done = self._dispatched.get(epoch, -1)
        for rec in records:
            seq = rec.get("seq")
            if isinstance(seq, int) and not isinstance(seq, bool) and seq <= done:
                continue
            if rec.get("verdict") in ("delay", "reject") or rec.get("kind") == "room":
                for listener in self.listeners:
                    try:
                        listener(rec)
                    except Exception:  # noqa: BLE001 - a listener bug must not stop the log
                        log.exception("decision listener failed")
        self._dispatched[epoch] = max(next_, done)
        self._dispatched.move_to_end(epoch)
        while len(self._dispatched) > DISPATCH_EPOCHS:
            self._dispatched.popitem(last=False)

    async def drain_once(self) -> int:
        """One pull (following up while the ring has more); returns the records handled."""
        handled = 0
        for _ in range(100):
            body = await self.client.decisions(self.next, self.limit)
            try:  # before anything is written: a bad answer is not logged, dispatched or acknowledged
                dropped = _count(body, "dropped", 0)
                next_ = _count(body, "next", self.next)
                last = _count(body, "last", 0)
            except ValueError as exc:
                self.bad_answers += 1
                raise ExtenderUnavailable(f"GET /decisions: {exc}") from None
            received = body.get("records") or []
            epoch = str(body.get("epoch"))
            if self.epoch is not None and epoch != self.epoch and self.next:
                log.info("extender restarted (epoch %s → %s): reading its ring from the start", self.epoch, epoch)
                self.epoch, self.next = epoch, 0
                continue
            self.epoch = epoch
            if received and next_ <= self.next:
                # Records, but a cursor that does not move: nothing past what was handled (a misbehaving
                # answer). Logging them would repeat them on every poll, and 100 times in this loop.
                self._once(
                    "stale",
                    logging.WARNING,
                    "GET /decisions answered %d records but next %d does not move past %d: not logged again",
                    len(received),
                    next_,
                    self.next,
                )
                break
            now = round(self.clock(), 3)
            head = (
                [{"type": "gap", "epoch": epoch, "dropped": dropped, "after": self.next, "time": now}]
                if dropped
                else []
            )
            records, lines, first_bad, bad = (
                await asyncio.to_thread(_encode_decisions, head, received, epoch, now)
                if head or received
                else ([], [], None, 0)
            )
            if bad:
                self.skipped += bad
                self._once(
                    "skipped",
                    logging.WARNING,
                    "skipped %d decision records that are not JSON objects or hold what JSON cannot write "
                    "(NaN, infinities; the first: %.100r); later ones are only counted (Drainer.skipped)",
                    bad,
                    first_bad,
                )
            if dropped:
                self.dropped += dropped
                log.warning(
                    "the extender's decision ring dropped %d records before they were drained; "
                    "drain more often (decisionLog.drainIntervalS) or enlarge the ring (decisionRingSize)",
                    dropped,
                )
            # The listeners first: a requeue must not wait for the log's disk. When the write fails,
            # the cursor stays and the same records come again; they are not dispatched twice.
            self._dispatch(epoch, records, next_)
            await self._commit(lines, next_)
            handled += len(records)
            self.drained += len(records)
            if not received or self.next >= last:
                break
        return handled

    async def _commit(self, lines: list[bytes], next_: int) -> None:
        """Write ``lines`` and move the cursor to ``next_``, in one worker-thread call; the cursor file
        only when the cursor moved. Nothing is written without a log."""
        cursor = (self.epoch, next_)
        if self.log is not None and (lines or cursor != self._saved):
            moved = {"epoch": self.epoch, "next": next_} if cursor != self._saved else None
            try:
                await self.log.acommit(lines, moved)
            except CursorNotSaved:
                self.next = next_  # the lines are in the log: not again; the cursor file is retried
                raise
            self._saved = cursor
        self.next = next_

    def _write_failure(self, exc: OSError) -> None:
        """Count a failed write and log it once per kind of error (a full disk fails every poll)."""
        self.write_failed += 1
        self._write_errors.log(
            f"{type(exc).__name__}:{exc.errno}",
            logging.ERROR,
            "cannot write the decision log: %s (logged once until it works again; counted in decisionWriteFailed)",
            exc,
        )

    async def run(self) -> None:
        while True:
            try:
                await self.drain_once()
                self.last_error = None
                if self._write_errors.reset():
                    log.info("the decision log is written again")
            except ExtenderUnavailable as exc:
                if self.last_error is None:
                    log.warning("cannot drain decisions: %s (retrying every %.0fs)", exc, self.interval_s)
                self.last_error = str(exc)
            except OSError as exc:
                self._write_failure(exc)
                self.last_error = str(exc)
            except Exception as exc:  # noqa: BLE001 - one bad poll must not end the drain task
                self.last_error = f"{type(exc).__name__}: {exc}"[:500]
                self._once(
                    self.last_error,
                    logging.ERROR,
                    "draining decisions failed (retrying every %.0fs)",
                    self.interval_s,
                    exc_info=True,
                )
            await asyncio.sleep(self.interval_s)


# -- outcomes ---------------------------------------------------------------------------------------


def parse_time(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _condition(pod: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    c: Mapping[str, Any]
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return None


def ended_how(pod: Mapping[str, Any], deleted: bool) -> str | None:
    """How a pod's life ended, or None while it runs."""
    status = pod.get("status") or {}
    disruption = _condition(pod, "DisruptionTarget")
    if disruption is not None and disruption.get("status") == "True":
        return "preempted" if disruption.get("reason") == "PreemptionByScheduler" else "evicted"
    if status.get("reason") == "Evicted":
        return "evicted"
    phase = status.get("phase")
    if phase == "Succeeded":
        return "succeeded"
    if phase == "Failed":
        return "failed"
    return "deleted" if deleted else None


LOAD_ANSWER_BYTES = 1 << 20
"""The most of a Prometheus answer :class:`LoadProbe` reads: its queries select one node (one series,
~200 bytes); a query that is not aggregated must not make it read megabytes."""


class LoadProbe:
    """A node's load from Prometheus (instant queries, one per column)."""

    def __init__(self, url: str, queries: Mapping[str, str], node_label: str = "node", timeout_s: float = 5.0):
        self.url = url.rstrip("/")
        self.queries, self.node_label = dict(queries), node_label
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def sample(self, node: str) -> dict[str, float]:
        out: dict[str, float] = {}
        selector = f'{self.node_label}="{node}"'
        async with aiohttp.ClientSession(timeout=self.timeout) as session:
            for column, query in self.queries.items():
                q = query.replace("NODE_SELECTOR", selector)
                try:
                    async with session.get(f"{self.url}/api/v1/query", params={"query": q}) as resp:
                        body = json.loads(await read_capped(resp, LOAD_ANSWER_BYTES))
                    result = body["data"]["result"]
                    if result:
                        value = float(result[0]["value"][1])
                        if math.isfinite(value):  # Prometheus answers NaN for 0/0; JSON cannot hold it
                            out[column] = round(value, 4)
                except (
                    TimeoutError,
                    aiohttp.ClientError,
                    AnswerTooLong,
                    KeyError,
                    IndexError,
                    TypeError,
                    ValueError,
                    RecursionError,
                ) as exc:
                    log.debug("load query %s for %s failed: %s", column, node, exc)
        return out


class OutcomeTracker:
    """Pod events → ``outcome`` lines (module docstring). Fed by the operator's pod watch."""

    def __init__(
        self,
        write: Callable[[list[dict[str, Any]]], Awaitable[object]],
        probe: LoadProbe | None = None,
        load_delay_s: float = 60.0,
        recent_s: float = 600.0,
        memory: int = 100_000,
        clock: Callable[[], float] = time.time,
    ):
        self.write, self.probe, self.load_delay_s, self.recent_s = write, probe, load_delay_s, recent_s
        self.clock = clock
        self.memory = memory
        self._seen: OrderedDict[str, set[str]] = OrderedDict()
        self._probes: set[asyncio.Task[None]] = set()
        self._once = LogOnce(log, 100).log
        self._write_errors = LogOnce(log, 100)
        """Write failures, logged once per kind of error until a write succeeds again."""
        self.probe_failures = 0
        """Load outcomes that could not be logged (the first error is logged)."""
        self.write_failed = 0
        """Batches of ``bound``/``ended`` outcomes that could not be written (a full disk, say): lost,
        counted, and logged once per kind of error rather than once per pod event."""

    def _mark(self, uid: str, event: str) -> bool:
        """True the first time (uid, event) is seen."""
        seen = self._seen.setdefault(uid, set())
        self._seen.move_to_end(uid)
        while len(self._seen) > self.memory:
            self._seen.popitem(last=False)
        if event in seen:
            return False
        seen.add(event)
        return True

    async def observe(self, event_type: str | None, pod: Mapping[str, Any]) -> None:
        """One watch event (``type`` None: the initial listing)."""
        meta = pod.get("metadata") or {}
        uid = meta.get("uid")
        if not uid:
            return
        ref = {"uid": uid, "namespace": meta.get("namespace"), "name": meta.get("name")}
        now = self.clock()
        created = parse_time(meta.get("creationTimestamp"))
        node = (pod.get("spec") or {}).get("nodeName")
        lines: list[dict[str, Any]] = []
        scheduled = _condition(pod, "PodScheduled")
        bound_at = (
            parse_time(scheduled.get("lastTransitionTime")) if scheduled and scheduled.get("status") == "True" else None
        )
        if node and self._binding_is_news(event_type, bound_at, now) and self._mark(uid, "bound"):
            at = bound_at or now
            lines.append(
                {
                    "type": "outcome",
                    "event": "bound",
                    "pod": ref,
                    "node": node,
                    "time": round(now, 3),
                    "pendingSeconds": round(at - created, 3) if created else None,
                }
            )
            if self.probe is not None and len(self._probes) < 1000:
                task = asyncio.get_running_loop().create_task(self._probe_later(ref, node))
                self._probes.add(task)
                task.add_done_callback(self._probes.discard)
        how = ended_how(pod, deleted=event_type == "DELETED" or bool(meta.get("deletionTimestamp")))
        if how is not None and (event_type is not None or how in ("evicted", "preempted")) and self._mark(uid, "ended"):
            start = bound_at or created
            lines.append(
                {
                    "type": "outcome",
                    "event": "ended",
                    "pod": ref,
                    "how": how,
                    "node": node,
                    "time": round(now, 3),
                    "lifetimeSeconds": round(now - start, 3) if start else None,
                }
            )
        if event_type == "DELETED":
            self._seen.pop(uid, None)
        if lines:
            await self._write(lines)

    def _binding_is_news(self, event_type: str | None, bound_at: float | None, now: float) -> bool:
        """Whether a bound pod's ``bound`` outcome is logged now: not when its PodScheduled condition says
        it was bound more than ``recent_s`` ago — whatever the event (the initial listing after a restart,
        or any later change of a pod that runs for hours), which would stamp an old binding with the
        current time and sample the node's load hours late. Without that time, only a watch event."""
        if bound_at is None:
            return event_type is not None
        return now - bound_at < self.recent_s

    async def _write(self, lines: list[dict[str, Any]]) -> None:
        """Write outcome lines; a failure is counted and logged once per kind of error, not raised (the
        pod watch would log it on every event)."""
        try:
            await self.write(lines)
        except OSError as exc:
            self.write_failed += 1
            self._write_errors.log(
                f"{type(exc).__name__}:{exc.errno}",
                logging.ERROR,
                "cannot write outcomes to the decision log: %s (logged once until it works again; counted in "
                "outcomeWriteFailed)",
                exc,
            )
            return
        if self._write_errors.reset():
            log.info("outcomes are written to the decision log again")

    async def _probe_later(self, ref: Mapping[str, Any], node: str) -> None:
        await asyncio.sleep(self.load_delay_s)
        assert self.probe is not None
        try:
            await self._write_load(ref, node, await self.probe.sample(node))
        except Exception as exc:  # noqa: BLE001 - a background task: an error here would go unseen
            self.probe_failures += 1
            self._once("probe", logging.ERROR, "cannot log the load of node %s: %s", node, describe(exc))

    async def _write_load(self, ref: Mapping[str, Any], node: str, load: dict[str, float]) -> None:
        if load:
            await self.write(
                [
                    {
                        "type": "outcome",
                        "event": "load",
                        "pod": dict(ref),
                        "node": node,
                        "time": round(self.clock(), 3),
                        "load": load,
                    }
                ]
            )

    async def close(self) -> None:
        for t in list(self._probes):
            t.cancel()
        await asyncio.gather(*self._probes, return_exceptions=True)
