"""The informer against servers that misbehave in ways that look like success: relists paced, a watch
that never watches reported down, Retry-After followed, lists that page on without end refused, and
the garbage collector paused (and only paused) while a list is read."""

from __future__ import annotations

import asyncio
import gc

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from sleep_clock import SleepClock

from rlsched.extender.gc_pause import GcPause
from rlsched.extender.kubeapi import MAX_LIST_ITEMS, ApiError, Informer, KubeApi, retry_after_seconds
from rlsched.extender.settings import KubeSettings
from rlsched.extender.testing import ScriptedWatchApi, make_node

GONE = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}


def informer(api, clock: SleepClock, **kw) -> Informer:
    return Informer(
        api,
        "nodes",
        "/api/v1/nodes",
        lambda items: None,
        lambda kind, obj: None,
        KubeSettings(),
        sleep=clock.sleep,
        jitter=lambda: 1.0,
        clock=clock,
        **kw,
    )


def event(name: str, rv: str) -> dict:
    return {"type": "MODIFIED", "object": make_node(name, rv=rv)}


async def test_a_server_that_answers_410_after_every_event_is_listed_at_a_growing_pace() -> None:
    """Each event reset the 410 count, so every 410 was "the first" and relisted at once: thousands
    of full lists a second against a real client, the watch reported up throughout."""
    script = [("list", [], "10")]
    for i in range(6):
        script += [("watch", [event("a", str(11 + i)), GONE]), ("list", [], str(20 + i))]
    api = ScriptedWatchApi(script)
    clock = SleepClock()
    with pytest.raises(asyncio.CancelledError):
        await informer(api, clock).run()
    assert [c for c in api.calls if c[0] == "list"] == [("list",)] * 7
    assert clock.sleeps == [1.0, 2.0, 4.0, 8.0, 16.0]  # the first relist at once, then the backoff of their count


async def test_only_the_lists_of_the_last_five_minutes_pace_the_next() -> None:
    api = ScriptedWatchApi([("list", [], str(i)) for i in range(4)])
    clock = SleepClock()
    inf = informer(api, clock)
    await inf.sync()
    clock.t += 400  # beyond RELIST_WINDOW_S: the first list no longer counts
    await inf.sync()
    await inf.sync()  # the first relist in the window: at once
    assert clock.sleeps == []
    await inf.sync()
    assert clock.sleeps == [1.0]


async def test_watches_that_end_at_once_fail_and_relist_after_three() -> None:
    """A server that accepts every watch and ends it at once without an event watches nothing: it was
    reported up (no failure, no readiness problem) while the cache never changed again."""
    api = ScriptedWatchApi(
        [
            ("list", [], "10"),
            ("watch", []),
            ("watch", []),
            ("watch", []),
            ("list", [], "20"),
            ("watch", [event("a", "21")]),
        ]
    )
    clock = SleepClock()
    inf = informer(api, clock)
    states = []

    async def sleep(s: float) -> None:
        states.append((inf.up, inf.failures, inf.down_for()))
        await clock.sleep(s)

    inf.sleep = sleep
    with pytest.raises(asyncio.CancelledError):
        await inf.run()
    assert clock.sleeps == [1.0, 2.0, 4.0]
    assert states == [(False, 1, 0.0), (False, 2, 1.0), (False, 3, 3.0)]  # down since the first
    assert [c[0] for c in api.calls] == ["list", "watch", "watch", "watch", "list", "watch", "watch"]
    assert inf.up and inf.failures == 0 and inf.last_error is None


async def test_a_watch_accepted_and_cut_again_and_again_stays_down_since_the_first_cut() -> None:
    """Every accepted watch used to clear the failure: a server that accepts and then cuts every watch
    never looked down for longer than one backoff, so readiness never reported it."""
    cut = ApiError(0, "Unreachable", "Response payload is not completed")
    api = ScriptedWatchApi([("list", [], "10")] + [("watch", [cut])] * 5)
    clock = SleepClock()
    inf = informer(api, clock)
    downs = []

    async def sleep(s: float) -> None:
        downs.append(round(inf.down_for(), 1))
        await clock.sleep(s)

    inf.sleep = sleep
    with pytest.raises(asyncio.CancelledError):
        await inf.run()
    assert downs == [0.0, 1.0, 3.0, 7.0, 15.0] and not inf.up
    assert [c[0] for c in api.calls].count("list") == 1  # a cut stream resumes; it does not relist


async def test_an_accepted_watch_after_failures_is_up_but_keeps_the_error_until_it_proves_itself() -> None:
    api = ScriptedWatchApi([("list", [], "10")])
    clock = SleepClock()
    inf = informer(api, clock)
    await inf.sync()
    await inf._failed("error", "reset", relist=False)
    inf._accepted()
    assert inf.up and inf.last_error == "reset" and inf.down_since is not None
    inf._opened()  # an event
    assert inf.up and inf.last_error is None and inf.down_since is None and inf.resolved["error"] == "reset"


async def test_retry_after_is_followed_within_a_bound() -> None:
    api = ScriptedWatchApi(
        [
            ("list", ApiError(429, "TooManyRequests", "slow down", retry_after_s=30.0)),
            ("list", [], "10"),
            ("watch", [event("a", "11")]),
        ]
    )
    clock = SleepClock()
    with pytest.raises(asyncio.CancelledError):
        await informer(api, clock).run()
    assert clock.sleeps == [30.0]  # not the 1 s backoff
    assert retry_after_seconds("30") == 30.0 and retry_after_seconds(" 7 ") == 7.0
    assert retry_after_seconds("86400") == 60.0  # RETRY_AFTER_MAX_S
    assert retry_after_seconds(None) is None and retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") is None
    # Only ASCII digits: "²" is a digit to str.isdigit() but broke float().
    assert retry_after_seconds("²") is None and retry_after_seconds("٣") is None
    assert (
        retry_after_seconds("1e9") is None
        and retry_after_seconds("-5") is None
        and retry_after_seconds("9" * 99) is None
    )


async def test_the_client_reads_retry_after_from_the_answer() -> None:
    async def busy(request: web.Request) -> web.Response:
        return web.json_response({"kind": "Status", "code": 429}, status=429, headers={"Retry-After": "12"})

    app = web.Application()
    app.router.add_get("/api/v1/nodes", busy)
    async with TestServer(app) as ts:
        api = KubeApi(str(ts.make_url("")), None, lambda: None)
        with pytest.raises(ApiError) as info:
            await api.list("/api/v1/nodes")
        await api.close()
    assert info.value.status == 429 and info.value.retry_after_s == 12.0


@pytest.mark.parametrize(
    "pages, problem",
    [
        ("same-token", "repeated a continue token"),
        ("items-object", "items or metadata are malformed"),
        ("metadata-list", "items or metadata are malformed"),
        ("token-number", "not text"),
        ("too-many", "more than"),
    ],
)
async def test_lists_that_page_on_or_answer_nonsense_fail_cleanly(pages: str, problem: str) -> None:
    """A server handing out the same continue token kept the list paging (and growing) for ever."""
    calls = []
    node = make_node("n0")

    async def handler(request: web.Request) -> web.Response:
        calls.append(dict(request.query))
        if pages == "same-token":
            return web.json_response({"items": [node], "metadata": {"continue": "again"}})
        if pages == "items-object":
            return web.json_response({"items": {"a": 1}, "metadata": {}})
        if pages == "metadata-list":
            return web.json_response({"items": [], "metadata": ["x"]})
        if pages == "token-number":
            return web.json_response({"items": [], "metadata": {"continue": 7}})
        start = int(request.query.get("continue") or 0)
        return web.json_response({"items": [{}] * 50_000, "metadata": {"continue": str(start + 1)}})

    app = web.Application()
    app.router.add_get("/api/v1/nodes", handler)
    async with TestServer(app) as ts:
        api = KubeApi(str(ts.make_url("")), None, lambda: None)
        with pytest.raises(ApiError) as info:
            await api.list("/api/v1/nodes", timeout=30)
        await api.close()
    assert problem in str(info.value) and info.value.status == 0
    if pages == "same-token":
        assert len(calls) == 2
    if pages == "too-many":
        assert len(calls) == MAX_LIST_ITEMS // 50_000 + 1


async def test_the_collector_is_paused_while_a_list_is_read_and_applied_and_back_after() -> None:
    seen = []
    pause = GcPause()

    def replace(items):
        seen.append(gc.isenabled())
        yield
        seen.append(gc.isenabled())

    api = ScriptedWatchApi([("list", [make_node("a")], "10"), ("list", ApiError(500, "", "boom"))])
    inf = Informer(api, "nodes", "/api/v1/nodes", replace, lambda k, o: None, KubeSettings(), gc_pause=pause)
    assert gc.isenabled()
    await inf.sync()
    assert seen == [False, False] and gc.isenabled() and pause.holders == 0
    inf.listed_at.clear()
    with pytest.raises(ApiError):
        await inf.sync()
    assert gc.isenabled() and pause.holders == 0  # a failed list gives it back too


def test_the_pause_is_counted_and_leaves_a_collector_that_was_off_off() -> None:
    pause = GcPause()
    assert gc.isenabled()
    with pause:
        with pause:
            assert not gc.isenabled()
        assert not gc.isenabled()  # the other holder is still inside
    assert gc.isenabled()
    gc.disable()
    try:
        with pause:
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


async def test_a_pause_longer_than_its_bound_turns_the_collector_back_on() -> None:
    """A list waits on the network between pages: a slow API server kept the collector off for as long
    as the list took (minutes at list_timeout_s per page) while requests went on making garbage."""
    pause = GcPause(max_s=0.05)
    with pause:
        assert not gc.isenabled()
        await asyncio.sleep(0.2)
        assert gc.isenabled() and pause.expired == 1
    assert gc.isenabled() and pause.holders == 0
    with pause:  # a new pause after it
        assert not gc.isenabled()
    assert gc.isenabled()


async def test_a_watch_that_stayed_open_ends_the_failure_streak() -> None:
    """One failure, then a quiet watch open for 200 s (no events: a quiet cluster), then one failure:
    the second failure was counted as 200 s down, and readiness failed at once."""
    cut = ApiError(0, "Unreachable", "connection reset")
    clock = SleepClock()
    api = ScriptedWatchApi([("list", [], "10"), ("watch", [cut]), ("watch", [cut])])
    inf = informer(api, clock)
    downs = []

    async def sleep(s: float) -> None:
        downs.append((inf.failures, inf.down_for()))
        await clock.sleep(s)

    inf.sleep = sleep
    real_accepted = inf._accepted

    def accepted() -> None:
        real_accepted()
        if len(downs) == 1:  # the second watch: open for 200 s before it is cut
            clock.t += 200

    inf._accepted = accepted
    with pytest.raises(asyncio.CancelledError):
        await inf.run()
    assert downs == [(1, 0.0), (1, 0.0)]  # a new streak, not (2, 201.0)


async def test_the_verbs_hold_the_processs_pause_shared_with_the_lists() -> None:
    """The verbs had a pause of their own: a filter in flight when a list began turned the collector
    back on when it ended, in the middle of the list. Now a verb is one more holder of the one pause."""
    import orjson
    from aiohttp.test_utils import TestClient

    from rlsched.extender.app import make_app
    from rlsched.extender.testing import Harness, make_pod

    class Counting(GcPause):
        most = 0

        def __enter__(self) -> GcPause:
            entered = super().__enter__()
            Counting.most = max(Counting.most, self.holders)
            return entered

    h = Harness([make_node("g0", gpus=2)])
    pause = Counting()
    body = orjson.dumps({"Pod": make_pod("p", gpus=1), "NodeNames": ["g0"]})
    async with TestClient(TestServer(make_app(h.extender, h.metrics, h.settings, gc_pause=pause))) as client:
        with pause:  # a list in progress
            answer = await client.post("/filter", data=body, headers={"Content-Type": "application/json"})
            assert answer.status == 200 and not gc.isenabled() and pause.holders == 1
        assert gc.isenabled() and pause.holders == 0
    assert Counting.most == 2  # the filter held it too


async def test_a_relist_failing_long_after_a_watch_was_accepted_continues_the_streak() -> None:
    """The time a watch was accepted outlived it: a watch answered 410 at once, then a list that failed
    60 s later, read as "a watch open 60 s" and restarted the outage clock (readiness a minute late)."""
    refused = ApiError(500, "InternalError", "etcd unavailable")
    clock = SleepClock()
    api = ScriptedWatchApi(
        [
            ("list", [], "10"),
            ("watch", [refused]),
            ("watch", [refused]),
            ("watch", [GONE]),
            ("list", refused),
            ("list", [], "20"),
        ]
    )
    inf = informer(api, clock)
    states = []
    real_list = api.list

    async def slow_list(*args, **kwargs):
        if len([c for c in api.calls if c[0] == "list"]) == 1:
            clock.t += 60  # the second list times out after a minute
        return await real_list(*args, **kwargs)

    api.list = slow_list

    async def sleep(s: float) -> None:
        states.append((inf.failures, round(inf.down_for())))
        await clock.sleep(s)

    inf.sleep = sleep
    with pytest.raises(asyncio.CancelledError):
        await inf.run()
    assert states[-1][0] == 3 and states[-1][1] >= 60, states  # the streak goes on, down for over a minute
    assert inf.up and inf.failures == 3  # the list that worked is up again; only an event resets the count
