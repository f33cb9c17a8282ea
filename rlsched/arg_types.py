"""argparse types for numbers a command line must bound: finite, and within a range.

``float("nan")``, ``float("inf")`` and negative counts parse fine and fail later, deep in a run (a
``sleep(nan)`` that never returns, a tight loop at 0 s, numpy refusing a negative seed). These types
refuse them where the flag is read: argparse prints ``argument --x: ...`` and exits 2.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def finite_number(above: float | None = None, least: float | None = None) -> Callable[[str], float]:
    """A finite float ``> above`` (when given) and ``>= least`` (when given)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if above is not None and not value > above:
            raise argparse.ArgumentTypeError(f"must be above {above:g}, got {text!r}")
        if least is not None and value < least:
            raise argparse.ArgumentTypeError(f"must be {least:g} or more, got {text!r}")
        return value

    return parse


def integer(least: int, most: int | None = None) -> Callable[[str], int]:
    """An int from ``least`` to ``most`` (no upper bound when None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < least or (most is not None and value > most):
            bound = f"{least}..{most}" if most is not None else f"{least} or more"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    return parse
