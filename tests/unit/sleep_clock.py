"""A fake monotonic clock that only a fake sleep moves, for the informer's backoff and pacing tests."""

from __future__ import annotations


class SleepClock:
    """``clock()`` reads the time; ``await clock.sleep(s)`` records ``s`` and moves the time on.
    ``step``: seconds added at every reading (a watch that reads the clock twice then "ran" for a while)."""

    def __init__(self, step: float = 0.0) -> None:
        self.t, self.step = 1000.0, step
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        self.t += self.step
        return self.t

    async def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s
