"""Pause Python's cyclic garbage collector while a list is read and applied.

Reading a list allocates millions of small objects (every page's JSON is parsed into dicts and
lists). Each allocation counts towards the collector's thresholds, so a relist sets off full
collections that walk every object the process holds: at 5,000 nodes and 20,000 pods one of them
held the event loop for 0.3–0.5 s, longer than applying the list itself
(``benchmarks/relist_hold.py``). A list creates no reference cycles (the parsed objects are freed by
reference counting once applied), so nothing is lost by not collecting while it runs; the young
objects that survive are collected once, after.

The pause is the process's (``gc`` has one switch), so it is counted: two informers may relist at
once, and the collector comes back on when the last of them ends. One instance is shared by every
informer of a process; a collector that was already off stays off.
"""

from __future__ import annotations

import gc
from types import TracebackType


class GcPause:
    """A re-entrant ``with`` block that turns the cyclic collector off while any holder is inside."""

    def __init__(self) -> None:
        self.holders = 0
        self._was_enabled = False

    def __enter__(self) -> GcPause:
        if self.holders == 0:
            self._was_enabled = gc.isenabled()
            gc.disable()
        self.holders += 1
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.holders -= 1
        if self.holders == 0 and self._was_enabled:
            gc.enable()
