"""The operator's clocks: durations on a monotonic clock, wall times only where they meet another
machine's (the extender's ``errorAt``, the API server's timestamps, the status a restarted operator
reads), and a wall clock that NTP steps (or another node's that runs behind) changes none of the
operator's decisions."""

from __future__ import annotations

import base64
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from test_operator_rebalancer import NOW, FakeKube, fake_planner, make, node, pod, spec

from rlsched.operator.decisionlog import DecisionLog
from rlsched.operator.extender_client import ExtenderView
from rlsched.operator.rebalance_budget import Ledger
from rlsched.operator.rebalance_select import started_at, why_not
from rlsched.operator.rebalancer import REFUSAL_COOLDOWN_S
from rlsched.operator.rollout import CLOCK_SKEW_S, ModelFetcher, Rollout, load_failed
from rlsched.operator.sink import CURRENT, Bundle, DirectorySink
from rlsched.operator.spec import parse_spec
from rlsched.operator.testing import EngineExtender, fake_model
from rlsched.operator.testing import FakeKube as FakeApi

HOUR = 3600.0


class Clocks:
    """A wall clock that NTP may step and a monotonic one that only time moves: :meth:`sleep` and
    :meth:`advance` move both, :meth:`step` the wall clock alone."""

    def __init__(self, wall: float = NOW, mono: float = 1000.0) -> None:
        self.w, self.m = wall, mono
        self.slept = 0.0

    def wall(self) -> float:
        return self.w

    def mono(self) -> float:
        return self.m

    def advance(self, s: float) -> None:
        self.w += s
        self.m += s

    def step(self, s: float) -> None:
        self.w += s

    async def sleep(self, s: float) -> None:
        self.slept += s
        self.advance(s)


# -- rollout: the verification deadline, errorAt ----------------------------------------------------


def _rollout(tmp_path: Path, clocks: Clocks, ext: EngineExtender, models: dict[str, bytes]) -> Rollout:
    kube = FakeApi()
    for name, data in models.items():
        kube.configmaps[("sched", name)] = {
            "metadata": {"name": name},
            "binaryData": {"model.npz": base64.b64encode(data).decode()},
        }
    return Rollout(
        DirectorySink(tmp_path / "policy"),
        ext,
        ModelFetcher(kube),
        timeout_s=120.0,
        poll_s=1.0,
        clock=clocks.wall,
        sleep=clocks.sleep,
        monotonic=clocks.mono,
    )


def _extender(tmp_path: Path) -> EngineExtender:
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "policy.yaml").write_text("{}\n")
    return EngineExtender(str(tmp_path / "policy" / "policy.yaml"))


def _spec(configmap: str) -> Any:
    return parse_spec(
        {"fallback": "least-allocated", "model": {"configMapKeyRef": {"name": configmap, "key": "model.npz"}}}
    )


class _Late(EngineExtender):
    """Reads the published files only from its ``reads_from``-th answer on (a ConfigMap volume the
    kubelet updates late); calls ``at_second`` on its second answer."""

    def __init__(self, policy_file: str, reads_from: int, at_second: Any = None) -> None:
        super().__init__(policy_file)
        self.reads_from, self.at_second, self.answers = reads_from, at_second, 0

    async def status(self) -> ExtenderView:
        self.answers += 1
        if self.answers == 2 and self.at_second is not None:
            self.at_second()
        if self.answers < self.reads_from:
            return ExtenderView.from_status({"policy": self.engine.status()})
        return await super().status()


async def test_a_wall_clock_stepped_forward_during_verification_does_not_fail_a_good_rollout(tmp_path: Path) -> None:
    """The deadline was on the wall clock: NTP stepping it forward an hour while the extender had not
    read the files yet ended the verification at once — RolloutTimeout, a good model rolled back."""
    _extender(tmp_path)
    clocks = Clocks()
    ext = _Late(str(tmp_path / "policy" / "policy.yaml"), reads_from=6, at_second=lambda: clocks.step(HOUR))
    rollout = _rollout(tmp_path, clocks, ext, {"m1": fake_model("v1")})
    try:
        result = await rollout.apply(await rollout.build("sched", "p", 1, _spec("m1")))
        assert result.ok and result.reason == "RolledOut", result.message
        assert ext.answers == 6
    finally:
        ext.engine.close()


async def test_a_wall_clock_stepped_back_during_verification_does_not_stretch_the_timeout(tmp_path: Path) -> None:
    """With the deadline on the wall clock, a step back of an hour kept polling an extender that never
    reads the files for an hour and two minutes instead of rolloutTimeoutS (120 s)."""
    _extender(tmp_path)
    clocks = Clocks()
    ext = _Late(str(tmp_path / "policy" / "policy.yaml"), reads_from=10**9, at_second=lambda: clocks.step(-HOUR))
    rollout = _rollout(tmp_path, clocks, ext, {"m1": fake_model("v1")})
    try:
        bundle = await rollout.build("sched", "p", 1, _spec("m1"))
        checked = await rollout.verify(bundle, await rollout.publish(bundle))
        assert checked.cause is not None and checked.cause.value == "RolloutTimeout"
        assert clocks.slept <= 121.0
    finally:
        ext.engine.close()


async def test_a_load_failure_is_seen_with_the_extenders_clock_behind(tmp_path: Path) -> None:
    """``errorAt`` (the extender's node's clock) was compared with the publication (the operator's)
    with 1 s of tolerance: an extender a few seconds behind made a broken model a RolloutTimeout after
    120 s, without the ``rollbackOf`` mark — every operator restart published it again."""
    ext = _extender(tmp_path)
    clocks = Clocks()
    ext.engine.clock = lambda: clocks.w - 90.0  # the extender's node runs a minute and a half behind
    rollout = _rollout(tmp_path, clocks, ext, {"m1": fake_model("v1"), "m2": b"\x00 not a model"})
    try:
        assert (await rollout.apply(await rollout.build("sched", "p", 1, _spec("m1")))).ok
        started = clocks.m
        result = await rollout.apply(await rollout.build("sched", "p", 2, _spec("m2")))
        assert result.reason == "ModelLoadFailed", result.message
        assert clocks.m - started < 5.0  # seen at once, not at rolloutTimeoutS
        current = await rollout.sink.read(CURRENT)
        assert current is not None and current.meta["rollbackOf"] == 2
    finally:
        ext.engine.close()


def test_only_a_new_error_about_our_own_published_bytes_is_taken_from_before_the_publication() -> None:
    """How far before the publication an error may be dated and still be ours: :data:`CLOCK_SKEW_S`
    for the operator's own content-addressed file when the error is not the one the extender showed
    just before the publication (the same bytes may have failed for a passing reason minutes ago: a
    review found a generation failed at once on that old error), about a second for a ``path`` model
    (other bytes may have failed at the path before), for an error that names no file, and when what
    the extender showed before is unknown."""
    name = "model-1111111111111111.npz"
    published = Bundle(
        {"mode": "active", "fallback": "fgd", "modelPath": f"/p/{name}"}, name, b"x", {"digest": "1" * 64}
    )
    path_model = Bundle(
        {"mode": "active", "fallback": "fgd", "modelPath": f"/p/{name}"}, None, None, {"digest": "1" * 64}
    )
    serving = dict(mode="active", fallback="fgd", model_path="/p/model-2222222222222222.npz", model_loaded=True)

    def error_at(at: float, **kw: Any) -> ExtenderView:
        return ExtenderView(**{**serving, "error": "ValueError: corrupt", "error_at": at, **kw})

    since = 10_000.0
    ours = {"error_path": f"/p/{name}"}
    nothing: tuple[None, None, None] = (None, None, None)  # no load error before the publication
    assert load_failed(error_at(since - CLOCK_SKEW_S + 1, **ours), published, since, nothing)
    assert not load_failed(error_at(since - CLOCK_SKEW_S - 1, **ours), published, since, nothing)
    old = error_at(since - 60, **ours)
    assert not load_failed(old, published, since, ("ValueError: corrupt", f"/p/{name}", since - 60))  # shown before
    assert not load_failed(old, published, since)  # before unknown: only the clocks' rounding
    assert not load_failed(error_at(since - 5, **ours), path_model, since, nothing)  # old bytes at the path
    assert load_failed(error_at(since - 0.5, **ours), path_model, since, nothing)
    other = {"error_path": "/p/model-3333333333333333.npz"}
    assert not load_failed(error_at(since + 5, **other), published, since, nothing)  # the file we roll back from
    named = ExtenderView(**{**serving, "error": f"ValueError: /p/{name}: corrupt", "error_at": since - 60})
    assert load_failed(named, published, since, nothing)
    anonymous = ExtenderView(**{**serving, "mode": "active", "error": "bad magic", "error_at": since - 60})
    assert not load_failed(anonymous, published, since, nothing)


async def test_an_old_failure_of_the_same_bytes_does_not_fail_their_new_publication(tmp_path: Path) -> None:
    """Generation 1's model failed for a passing reason (a MemoryError) and was rolled back; a minute
    later generation 2 published the very same bytes. The extender still showed the old error until it
    read the files again, and with five minutes of tolerance for errors about the operator's own file
    the first poll took it for generation 2's: rolled back, marked, never tried again."""
    from rlsched.operator.testing import fake_model_loader

    _extender(tmp_path)
    clocks = Clocks()
    loads = []

    def fails_once(path: str, typical: Any) -> Any:
        loads.append(path)
        if len(loads) == 1:
            raise MemoryError("passing")
        return fake_model_loader(path, typical)

    class EveryFifthAnswer(EngineExtender):  # reads the files on every fifth answer only
        answers = 0

        async def status(self) -> ExtenderView:
            self.answers += 1
            if self.answers % 5:
                return ExtenderView.from_status({"policy": self.engine.status()})
            return await super().status()

    ext = EveryFifthAnswer(str(tmp_path / "policy" / "policy.yaml"))
    ext.engine.model_loader = fails_once
    ext.engine.clock = clocks.wall
    rollout = _rollout(tmp_path, clocks, ext, {"m1": fake_model("v1")})
    try:
        first = await rollout.apply(await rollout.build("sched", "p", 1, _spec("m1")))
        assert first.reason == "ModelLoadFailed"
        clocks.advance(60)
        second = await rollout.apply(await rollout.build("sched", "p", 2, _spec("m1")))
        assert second.reason == "RolledOut" and len(loads) == 2
        assert (await rollout.sink.read(CURRENT)).meta.get("rollbackOf") is None
    finally:
        ext.engine.close()


# -- the decision log's segment names ----------------------------------------------------------------


def test_segments_stay_in_order_when_the_clock_steps_back(tmp_path: Path) -> None:
    """Segments were named by the wall clock's milliseconds and the oldest by name were deleted: after
    a step back the new segments sorted first, and the size bound deleted the newest decisions, kept
    the old ones, and a restart appended to an old segment."""
    clock = {"t": NOW}
    log = DecisionLog(tmp_path, segment_bytes=600, max_bytes=3000, fsync=False, clock=lambda: clock["t"])

    def write(tag: str, n: int) -> None:
        for i in range(n):
            clock["t"] += 10
            log.append([{"type": "decision", "tag": tag, "i": i, "pad": "x" * 80}])

    write("before", 40)
    clock["t"] -= HOUR
    write("after", 60)
    log.close()
    names = sorted(p.name for p in tmp_path.glob("segment-*.jsonl"))
    kept: dict[str, list[int]] = {}
    for name in names:
        for line in (tmp_path / name).read_text().splitlines():
            rec = json.loads(line)
            if rec.get("type") == "decision":
                kept.setdefault(rec["tag"], []).append(rec["i"])
    assert "before" not in kept and kept["after"][-1] == 59  # the oldest went, the newest stayed
    assert kept["after"] == sorted(kept["after"])
    last_written = max(tmp_path.glob("segment-*.jsonl"), key=lambda p: p.stat().st_mtime_ns).name
    assert names[-1] == last_written
    again = DecisionLog(tmp_path, segment_bytes=600, max_bytes=3000, fsync=False, clock=lambda: clock["t"])
    again.open()  # appends to the segment written last, or (it is full) starts one after it
    assert again._path is not None and again._path.name >= last_written
    assert again._path.name == max(p.name for p in tmp_path.glob("segment-*.jsonl"))
    again.close()


# -- the rebalancer: pod age, budgets, cooldowns, interval -------------------------------------------


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_node_clock_behind_does_not_make_a_young_pod_old() -> None:
    """A pod's age came from ``status.startTime`` (the kubelet's node clock) in preference to
    ``metadata.creationTimestamp`` (the API server's): a node 15 minutes behind let a pod created a
    minute ago pass minPodAgeSeconds 600 and be evicted."""
    p = {
        "metadata": {
            "name": "p",
            "namespace": "team",
            "uid": "u",
            "labels": {"rlsched.io/rebalance": "true"},
            "creationTimestamp": _iso(NOW - 60),
            "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "uid": "o", "controller": True}],
        },
        "spec": {"schedulerName": "rl-scheduler", "nodeName": "n1"},
        "status": {"phase": "Running", "startTime": _iso(NOW - 60 + 5 - 900)},
    }
    assert started_at(p) == NOW - 60
    assert why_not(p, "rl-scheduler", lambda _ns: False, 600, NOW, lambda _ns: True) == "too-young"
    p["status"]["startTime"] = _iso(NOW - 60 + 5)  # a node on time: it started after its creation
    assert started_at(p) == NOW - 55


async def test_a_wall_clock_stepped_forward_does_not_renew_the_hours_budget() -> None:
    """The hourly budget ran on the wall clock: NTP stepping it an hour forward let a second eviction
    through three minutes after the first, with maxMovesPerHour 1."""
    kube = FakeKube(
        [node("n0"), node("n1"), node("n2")],
        [pod("a", "n0", gpus=1), pod("b", "n1", gpus=1), pod("c", "n1", gpus=1, owner_name="x")],
    )
    clocks = Clocks()
    rb, _ = make(kube, fake_planner("team/a", "team/b", "team/c"), clocks.wall, clocks.mono)
    s = spec(intervalSeconds=60, budget={"maxMovesPerCycle": 1, "maxMovesPerHour": 1})
    first = await rb.cycle(s, None)
    assert [m["pod"] for m in first.moves] == ["team/a"]
    status = rb.as_status(first)
    clocks.advance(120)
    clocks.step(HOUR)
    again = await rb.cycle(s, status)
    assert again.outcome == "budget_exhausted" and [e[0] for e in kube.evictions] == ["team/a"]
    assert rb.as_status(again)["recent"] == status["recent"]  # the status keeps the eviction's wall date


async def test_a_wall_clock_stepped_back_does_not_stop_the_cycles_or_stretch_a_cooldown() -> None:
    """The interval and a refused pod's cooldown ran on the wall clock: a step back of an hour stopped
    every cycle for an hour and kept the pod out for an hour and a quarter instead of 15 minutes."""
    pods = [pod("a", "n0", gpus=1, age=2 * HOUR), pod("b", "n1", gpus=1, age=2 * HOUR)]
    kube = FakeKube([node("n0"), node("n1"), node("n2")], pods)
    kube.pdb.add("a")
    clocks = Clocks()
    rb, _ = make(kube, fake_planner("team/a"), clocks.wall, clocks.mono)
    s = spec(intervalSeconds=60)
    first = await rb.cycle(s, None)
    assert [m["result"] for m in first.moves] == ["blocked_by_pdb"]
    kube.pdb.clear()
    clocks.step(-HOUR)
    clocks.advance(60)
    assert rb.due(s)
    clocks.advance(REFUSAL_COOLDOWN_S)
    later = await rb.cycle(s, rb.as_status(first))
    assert [m["pod"] for m in later.moves] == ["team/a"] and later.skipped["recently-refused"] == 0
    rb.skipped()  # what the handler does when the extender does not answer
    clocks.step(-HOUR)
    clocks.advance(60)
    assert rb.due(s)


def test_an_eviction_keeps_its_wall_date_and_a_merge_after_a_step_counts_it_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The ledger kept wall times only: its ages followed the wall clock's steps. On the monotonic
    clock, the status must still show the wall date, and merging it back after the wall clock stepped
    back must neither count the eviction twice nor drop it as dated in the future."""
    ledger = Ledger()
    ledger.add("team/ReplicaSet/a", 1000.0, NOW)
    status = ledger.dump()
    assert status == [{"at": NOW, "owner": "team/ReplicaSet/a"}]
    assert ledger.merge(status, 1060.0, NOW + 60 - HOUR) == 0  # stepped back an hour meanwhile
    assert ledger.in_last_hour(1060.0) == 1 and "in the future" not in caplog.text
    assert ledger.in_last_hour(1000.0 + HOUR) == 0  # the hour ends an hour after, whatever the wall clock did
    # another process's eviction, 30 s before: placed on this ledger's clock by the wall clock
    assert ledger.merge([{"at": NOW + 30 - HOUR, "owner": "team/ReplicaSet/b"}], 1060.0, NOW + 60 - HOUR) == 1
    (b,) = [r for r in ledger.records if r.owner == "team/ReplicaSet/b"]
    assert b.at == 1030.0 and ledger.dump()[-1] == {"at": NOW + 30 - HOUR, "owner": "team/ReplicaSet/b"}
