"""The rebalancer's migration budget: per cycle, per sliding hour, per controller per window.

Per pod the budget is one by construction: an evicted pod is gone, its controller makes a new one
(a new UID) — so "a pod's lifetime" is counted per *controller* (``namespace/Kind/name``): at most
``maxMovesPerOwner`` evictions of its pods per ``ownerWindowSeconds``. A replacement pod is also
younger than ``minPodAgeSeconds`` for a while, which keeps the same workload from bouncing.

Where it lives: in memory, and mirrored into the SchedulingPolicy's ``status.rebalance.recent`` (the
evictions of the last :data:`KEEP_S`, at most :data:`MAX_RECENT`) before every eviction (written
ahead: an operator killed between an eviction and the end of its cycle has recorded it) and after
every cycle. :meth:`Ledger.merge` reads it back at the start of every cycle and adds what the ledger
lacks, so neither the hourly nor the per-owner budget resets when the operator restarts, and a
replica that was paused (kopf peering) while another one evicted counts that one's evictions too —
and writes them back with its own instead of erasing them. Each eviction is dated when it is
written ahead, just before it is sent (the write takes at most the API timeout), not when its cycle
began: a cycle may take minutes, and a record dated earlier than its eviction
would leave the sliding hour early. Dry-run moves go to a ledger of their own, in memory only (they
move nothing), so that a dry run shows what the budgets would let a real one do.
An eviction whose answer was lost (the rebalancer's ``unknown``) is recorded like one that was answered:
the API server may have carried it out, and the budget errs on the side of fewer moves.

How long a record is kept does not depend on the spec: :data:`KEEP_S` is the longest
``ownerWindowSeconds`` the CRD allows. A record kept only for the current window would be forgotten by
the first cycle run with a shorter one (a dry run previewing a short window, or a window shortened for a
while), and when the window was set back its controller could be evicted again inside it. The current
windows decide only what *counts* (:meth:`Ledger.counting`); a full ledger drops its oldest records,
which lie outside them (:class:`Allowance` stops the moves before a record that counts would go).

That promise is bounded by :data:`MAX_RECENT`: while the ledger has room a shorter window forgets
nothing, but once it holds :data:`MAX_RECENT` records a cycle under a shorter window drops the oldest
ones to make room, and a longer window set back later no longer counts them: a longer window counts the
newest :data:`MAX_RECENT` evictions only (about a week at the default six an hour). Keeping every record
of the longest window instead would make a full ledger spend the budget whatever the current window: at
the default budget the rebalancer would stop after a week and then move about 33 pods a day instead of
144. Raising the cap is no way out: ``maxMovesPerHour`` may be 1,000, 720,000 records in 30 days, and
the status (one object in etcd) holds about 1.5 MB.

Two clocks: every age in the ledger (the hour, the owner window, :data:`KEEP_S`) is measured on the
rebalancer's monotonic clock, so a wall clock that NTP steps neither renews the hour's budget at once
(a step forward) nor holds it for an hour more (a step back). The wall clock dates a record only for
the status: each record keeps the wall date of its eviction (:attr:`Record.wall`), written as it is
and known by it when the status is merged back; a record read from the status (another process's) is
placed on the monotonic clock by the wall clock's reading at the merge. So a restarted operator, whose
monotonic clock starts anew, still counts the evictions before it — by their wall dates: a step of the
wall clock between them moves those by the step, the one thing a persisted date cannot avoid.

The merged list is read from an object anyone with write access to the status can edit, so
:meth:`Ledger.merge` keeps only entries that are well-formed and younger than :data:`KEEP_S`: an entry dated
more than :data:`MAX_CLOCK_SKEW_S` ahead would never be pruned and would count in every hour (the
hourly budget exhausted for good, and written back by every cycle); those are dropped and logged.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .rebalance_spec import MAX_OWNER_WINDOW_S

log = logging.getLogger("rlsched.operator.rebalancer")  # the rebalancer's concern, its logger

HOUR_S = 3600.0
KEEP_S = max(HOUR_S, float(MAX_OWNER_WINDOW_S))
"""How long a record is kept, whatever the spec's windows (module docstring): the hour, and the longest
``ownerWindowSeconds`` a spec may set."""
MAX_RECENT = 1000
"""Evictions kept (in memory and in the status). When there are more, the oldest go: records outside the
current windows only, since a ledger whose records inside them fill it spends the budget
(:class:`Allowance`), so the per-owner budget cannot forget a move it still counts — under the current
windows; a longer window set later counts only what is left (module docstring)."""
MAX_WITHDRAWN = MAX_RECENT
"""Withdrawn records remembered (:attr:`Ledger.withdrawn`); past that the earliest withdrawn is forgotten."""
MAX_OWNER_CHARS = 400
"""Length of a controller key read from the status (longer ones are cut: the status is not trusted)."""
MAX_CLOCK_SKEW_S = 300.0
"""How far ahead of this operator's clock an eviction read from the status may be dated and still be
taken. The status was written by an earlier operator process or another replica, perhaps on another
node whose clock runs a little ahead; beyond a few minutes the date is not skew but a bad entry
(module docstring)."""


@dataclass(frozen=True)
class Record:
    """One eviction (or one written ahead of it)."""

    at: float
    """When, on the ledger's clock: the rebalancer's monotonic one (module docstring); every age is
    measured from it."""
    owner: str
    wall: float | None = None
    """When, on the wall clock: the date the status shows, and the one a merge knows the record by
    (:func:`_key`); None for a ledger on one clock (``at`` is then the wall date)."""

    @property
    def date(self) -> float:
        """The wall date (:attr:`wall`, else :attr:`at`)."""
        return self.at if self.wall is None else self.wall


class Ledger:
    """Evictions made, for the budget (module docstring)."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.withdrawn: dict[tuple[float, str], float] = {}
        """Records taken back (:meth:`discard`: written ahead of an eviction that did not happen), by
        key (its wall date) → date (the ledger's clock), in the order they were withdrawn: a status
        patch that did not land still lists them, and :meth:`merge` must not count them again (they
        would spend the budget for a whole window).

        How long they matter: a status lists a withdrawn record only until a status patch lands after
        its withdrawal (every patch writes the ledger whole, without it), and :meth:`merge` takes nothing
        older than :data:`KEEP_S`. So an entry is kept :data:`KEEP_S` (:meth:`prune`) but at most
        :data:`MAX_WITHDRAWN` are: when full, the earliest withdrawn goes, never the newest. That one has
        :data:`MAX_WITHDRAWN` withdrawals after it; either a status patch landed since (its write ahead of
        a later eviction, or a cycle's), and no status lists it any more, or none did — a failed write
        ahead ends the cycle's evictions, so :data:`MAX_WITHDRAWN` cycles in a row without one status
        write. Only then can it count again, and that costs a move, never allows one more. Kept for
        :data:`KEEP_S` under the cap alone, a PDB refusing every five-minute cycle (about 300 a day)
        filled it in four days, and from then on every refused eviction whose status patch was lost
        counted again."""

    def merge(self, recent: Any, now: float, wall_now: float | None = None) -> int:
        """Add the records of ``status.rebalance.recent`` (``[{at, owner}]``) that the ledger lacks, the
        same eviction being the same ``(at, owner)`` at the status' precision (milliseconds), ``at`` its
        wall date (:attr:`Record.wall`). ``now``: the ledger's clock; ``wall_now``: the wall clock at the
        same moment (None: the ledger runs on the wall clock), which dates in the status are compared
        with and which places a record read from it on the ledger's clock. Called
        every cycle: the status may hold evictions this process never made (its own before a restart,
        or another replica's while this one was paused). Bad entries are skipped, and so are those
        older than :data:`KEEP_S` and those dated more than :data:`MAX_CLOCK_SKEW_S` after ``wall_now``
        (logged, with how many). The ledger never grows past :data:`MAX_RECENT` here: when the union is
        larger, the newest are kept, and a ledger whose records inside the current windows fill it
        spends the budget (:class:`Allowance`) until the oldest leave them. Returns how many records
        were added."""
        wall = now if wall_now is None else wall_now
        future = 0
        have = {_key(r.date, r.owner) for r in self.records}
        new: list[Record] = []
        for item in recent[:MAX_RECENT] if isinstance(recent, list) else ():
            record = _parse(item)
            if record is None:
                continue
            key = _key(record.at, record.owner)
            if key in have or key in self.withdrawn:  # before the dates: a clock stepped back since
                continue
            if record.at > wall + MAX_CLOCK_SKEW_S:  # +inf too
                future += 1
                continue
            if wall - record.at >= KEEP_S:  # outside every window a spec may set (-inf too)
                continue
            have.add(key)
            new.append(Record(record.at - (wall - now), record.owner, record.at))
        if future:
            log.warning(
                "rebalancer: %d eviction(s) in status.rebalance.recent are dated more than %.0f s in the future; "
                "dropped (not counted against the budget)",
                future,
                MAX_CLOCK_SKEW_S,
            )
        union = sorted(self.records + new, key=lambda r: r.at)
        kept = union[-MAX_RECENT:]  # the newest: they count in the windows longest
        fresh = {id(r) for r in new}
        added = sum(1 for r in kept if id(r) in fresh)
        self.records = kept
        return added

    def prune(self, now: float) -> None:
        """Forget the records older than :data:`KEEP_S` (never by the spec's windows: module docstring)."""
        self.records = [r for r in self.records if now - r.at < KEEP_S]
        self.withdrawn = {k: at for k, at in self.withdrawn.items() if now - at < KEEP_S}

    def counting(self, now: float, owner_window_s: float) -> int:
        """Records that count now: inside the hour or ``owner_window_s`` (dated ahead included)."""
        keep = max(HOUR_S, owner_window_s)
        return sum(1 for r in self.records if now - r.at < keep)

    def in_last_hour(self, now: float) -> int:
        return sum(1 for r in self.records if now - r.at < HOUR_S)

    def owner_moves(self, owner: str, now: float, owner_window_s: float) -> int:
        return sum(1 for r in self.records if r.owner == owner and now - r.at < owner_window_s)

    def add(self, owner: str, now: float, wall: float | None = None) -> Record:
        """Record an eviction at ``now`` (the ledger's clock) and ``wall`` (the wall clock: the date the
        status shows; None: ``now`` is one); past :data:`MAX_RECENT` the oldest record goes (one outside
        the current windows: :class:`Allowance` allows no move while those inside them fill the ledger;
        a longer window set later would have counted it: module docstring)."""
        record = Record(now, owner, wall)
        self.records.append(record)
        if len(self.records) > MAX_RECENT:
            self.records.sort(key=lambda r: r.at)
            del self.records[: len(self.records) - MAX_RECENT]
        return record

    def discard(self, record: Record) -> None:
        """Take back a record added ahead of an eviction that did not happen (this very object); it is
        remembered as withdrawn for :data:`KEEP_S`, the earliest withdrawn forgotten first past
        :data:`MAX_WITHDRAWN` (:attr:`withdrawn`)."""
        for i, r in enumerate(self.records):
            if r is record:
                del self.records[i]
                key = _key(r.date, r.owner)
                self.withdrawn.pop(key, None)  # withdrawn again: it goes to the end, the newest
                self.withdrawn[key] = r.at
                while len(self.withdrawn) > MAX_WITHDRAWN:
                    del self.withdrawn[next(iter(self.withdrawn))]
                return

    def dump(self) -> list[dict[str, Any]]:
        return [{"at": round(r.date, 3), "owner": r.owner} for r in self.records]


def _parse(item: Any) -> Record | None:
    """One ``{at, owner}`` entry of the status, or None when it is not one (NaN dates included)."""
    if not isinstance(item, Mapping):
        return None
    at, owner = item.get("at"), item.get("owner")
    if not (isinstance(at, (int, float)) and not isinstance(at, bool) and isinstance(owner, str)):
        return None
    if math.isnan(at):
        return None
    return Record(float(at), owner[:MAX_OWNER_CHARS])


def _key(at: float, owner: str) -> tuple[float, str]:
    """What makes two records the same eviction: the status keeps milliseconds (:meth:`Ledger.dump`)."""
    return round(at, 3), owner[:MAX_OWNER_CHARS]


@dataclass
class Allowance:
    """What one cycle may still do."""

    cycle: int
    hour: int
    room: int = MAX_RECENT
    """Records the ledger can still take without dropping one that counts (:data:`MAX_RECENT`)."""

    @property
    def left(self) -> int:
        return max(0, min(self.cycle, self.hour, self.room))

    def spend(self) -> None:
        self.cycle -= 1
        self.hour -= 1
        self.room -= 1


def allowance(ledger: Ledger, now: float, per_cycle: int, per_hour: int, owner_window_s: float) -> Allowance:
    """What a cycle may do: ``room`` counts the records inside the hour or ``owner_window_s`` only (those
    older stay in the ledger, :data:`KEEP_S`, but a new one may take their place)."""
    return Allowance(
        cycle=per_cycle,
        hour=per_hour - ledger.in_last_hour(now),
        room=MAX_RECENT - ledger.counting(now, owner_window_s),
    )


def owners_over_budget(ledger: Ledger, owners: Iterable[str], now: float, per_owner: int, window_s: float) -> set[str]:
    """The ``owners`` with ``per_owner`` moves or more in the window: one pass over the ledger (asking
    :meth:`Ledger.owner_moves` per owner was owners × records: 62 ms a cycle at 5,000 owners)."""
    moves = Counter(r.owner for r in ledger.records if now - r.at < window_s)
    return {o for o in set(owners) if o and moves[o] >= per_owner}
