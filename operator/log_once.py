"""Log a recurring problem once per distinct key: a poll or a watch that fails the same way every few
seconds must not fill the log, and a new kind of failure must still show."""

from __future__ import annotations

import logging
from typing import Any


class LogOnce:
    """``log(key, level, message, *args)`` logs only the first time ``key`` is seen. At most ``size``
    keys are remembered; past that the memory starts over (a failure may then be logged once more)."""

    def __init__(self, logger: logging.Logger, size: int = 1000):
        self.logger, self.size = logger, size
        self._seen: set[str] = set()

    def log(self, key: str, level: int, message: str, *args: Any, exc_info: bool = False) -> None:
        if key in self._seen:
            return
        if len(self._seen) >= self.size:
            self._seen.clear()
        self._seen.add(key)
        self.logger.log(level, message, *args, exc_info=exc_info)

    def reset(self) -> bool:
        """Forget every key (the problem went away: its return is news again); whether any was logged."""
        had = bool(self._seen)
        self._seen.clear()
        return had
