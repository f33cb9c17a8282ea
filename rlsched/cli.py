"""The ``rlsched`` command line: ``rlsched train | evaluate | extender | operator``."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("rlsched: not yet", file=sys.stderr)
    return 2
