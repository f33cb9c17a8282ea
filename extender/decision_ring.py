"""A bounded in-memory ring of recent decisions, drained by the operator through ``GET /decisions``.

Each record gets a cursor (``seq``, increasing from 1 for the life of the process) and a wall-clock
``time``. ``read(after)`` returns the records with ``seq > after``; when the ring has already
overwritten some of them the answer says how many were ``dropped``, so the operator's decision log
can note the gap. A restart starts again at 1 with a new ``epoch`` (the process start time), so a
reader that sees the epoch change starts over from 0.

A record may be appended as a function that builds it (:meth:`DecisionRing.append_lazy`): its cursor
and time are taken at once, the dict is built only when someone reads it. Most records are
overwritten unread when nobody drains the ring, and building one per filter cost ~0.08 ms.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from itertools import islice
from typing import Any

MAX_READ = 10_000
"""The most records one ``GET /decisions`` returns (its ``limit``)."""


class _Lazy:
    """A record not built yet: the function that builds it, its cursor and its time."""

    __slots__ = ("build", "record", "seq", "time")

    def __init__(self, build: Callable[[], dict[str, Any]], seq: int, at: float):
        self.build: Callable[[], dict[str, Any]] | None = build
        self.record: dict[str, Any] | None = None
        self.seq, self.time = seq, at

    def get(self) -> dict[str, Any]:
        if self.record is None:
            assert self.build is not None
            record = self.build()
            record["seq"] = self.seq
            record.setdefault("time", round(self.time, 6))
            self.record, self.build = record, None  # built once; what the function held is let go
        return self.record


class DecisionRing:
    def __init__(self, size: int, clock: Callable[[], float] = time.time):
        self.size = size
        self.clock = clock
        self.epoch = f"{clock():.6f}"
        self._items: deque[dict[str, Any] | _Lazy] = deque(maxlen=size)
        self._seq = 0

    def append(self, record: dict[str, Any]) -> int:
        self._seq += 1
        record["seq"] = self._seq
        record.setdefault("time", round(self.clock(), 6))
        self._items.append(record)
        return self._seq

    def append_lazy(self, build: Callable[[], dict[str, Any]]) -> int:
        """Like :meth:`append` for the dict ``build()`` returns, built at the first read. ``build``
        must capture what the record reports (the state changes after the call)."""
        self._seq += 1
        self._items.append(_Lazy(build, self._seq, self.clock()))
        return self._seq

    @property
    def last(self) -> int:
        return self._seq

    def read(self, after: int, limit: int = 1000) -> dict[str, Any]:
        """Records with ``seq > after`` (oldest first, at most ``limit``) and the next cursor.

        A cursor beyond the last record (from a previous process) is treated as "from the start".
        """
        reset = after > self._seq
        after = 0 if reset or after < 0 else after
        first = self._seq - len(self._items) + 1
        dropped = max(0, first - after - 1)
        start = max(after + 1, first) - first
        records = [
            item.get() if isinstance(item, _Lazy) else item
            for item in islice(self._items, start, start + max(limit, 0))
        ]
        nxt = records[-1]["seq"] if records else max(after, first - 1)
        return {
            "epoch": self.epoch,
            "next": nxt,
            "last": self._seq,
            "dropped": dropped,
            "reset": reset,
            "records": records,
        }

    def __len__(self) -> int:
        return len(self._items)
