"""A bounded in-memory ring of recent decisions, drained by the operator through ``GET /decisions``.

Each record gets a cursor (``seq``, increasing from 1 for the life of the process) and a wall-clock
``time``. ``read(after)`` returns the records with ``seq > after``; when the ring has already
overwritten some of them the answer says how many were ``dropped``, so the operator's decision log
can note the gap. A restart starts again at 1 with a new ``epoch`` (the process start time), so a
reader that sees the epoch change starts over from 0.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from itertools import islice
from typing import Any


class DecisionRing:
    def __init__(self, size: int, clock: Callable[[], float] = time.time):
        self.size = size
        self.clock = clock
        self.epoch = f"{clock():.6f}"
        self._items: deque[dict[str, Any]] = deque(maxlen=size)
        self._seq = 0

    def append(self, record: dict[str, Any]) -> int:
        self._seq += 1
        record["seq"] = self._seq
        record.setdefault("time", round(self.clock(), 6))
        self._items.append(record)
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
        records = list(islice(self._items, start, start + max(limit, 0)))
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
