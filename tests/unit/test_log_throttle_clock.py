"""EveryFewSeconds on a fake clock: a line per kind per period (the period's end included), the
count of lines left out, and a bounded table of kinds."""

from __future__ import annotations

from rlsched.extender.log_throttle import MAX_KINDS, EveryFewSeconds


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_line_per_period_with_the_count_left_out() -> None:
    clock = Clock()
    quiet = EveryFewSeconds(10.0, clock)
    assert quiet("a") == 0
    assert [quiet("a") for _ in range(3)] == [None, None, None]
    assert quiet("b") == 0  # kinds are apart
    clock.now += 9.999
    assert quiet("a") is None
    clock.now = 110.0  # exactly one period after the last line
    assert quiet("a") == 4
    clock.now += 10.0
    assert quiet("a") == 0  # the count starts again after each line


def test_the_table_of_kinds_is_bounded() -> None:
    clock = Clock()
    quiet = EveryFewSeconds(10.0, clock)
    for i in range(MAX_KINDS):
        assert quiet(f"k{i}") == 0
    assert quiet("k0") is None  # still remembered
    assert quiet("one-too-many") == 0  # the full table is emptied ...
    assert quiet("k1") == 0  # ... so an old kind logs again within its period
    assert len(quiet._last) <= MAX_KINDS


def test_a_failing_counter_does_not_break_the_http_server_log(caplog) -> None:
    import logging

    from aiohttp.http_exceptions import BadHttpMessage

    from rlsched.extender.log_throttle import HttpServerLog

    def broken() -> None:
        raise RuntimeError("registry gone")

    log = HttpServerLog("status", count=broken)
    with caplog.at_level(logging.WARNING):
        log.log(logging.ERROR, "Error handling request from %s", "10.0.0.1", exc_info=BadHttpMessage("bad"))
    messages = [r.getMessage() for r in caplog.records]
    assert any("counting a malformed request failed" in m for m in messages)
    assert any("is not valid HTTP" in m for m in messages)
