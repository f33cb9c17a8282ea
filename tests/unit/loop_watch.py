"""How long the event loop stalls while a block runs: for tests of work that must stay off the loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


@asynccontextmanager
async def loop_stalls(tick_s: float = 0.02) -> AsyncIterator[list[float]]:
    """Yields the list of gaps between ticks of a ``tick_s`` heartbeat, filled while the block runs:
    ``max()`` of it is the longest the loop was held."""
    gaps: list[float] = []
    done = False

    async def heartbeat() -> None:
        last = time.monotonic()
        while not done:
            await asyncio.sleep(tick_s)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    beat = asyncio.create_task(heartbeat())
    try:
        yield gaps
    finally:
        done = True
        await beat
