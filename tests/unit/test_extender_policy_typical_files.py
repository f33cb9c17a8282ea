"""What the policy file names besides the model: its ``typicalPodsPath`` (read off the event loop, a
regular file under a size cap), the typical pods a new model brings (the fallback follows them), and
``seed`` (start-up only: ignored in the policy file, loudly)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import rlsched.extender.policy as policy_module
from rlsched.extender.metrics import Metrics
from rlsched.extender.policy import PolicyEngine, load_typical
from rlsched.extender.settings import ConfigError, PolicySettings
from rlsched.policy.scorers import FgdScorer
from rlsched.policy.typical import TypicalPods

ONE_GROUP = [{"cpuMilli": 4000, "gpuMilli": 1000, "numGpu": 1, "weight": 1}]
TWO_GROUPS = [
    {"cpuMilli": 1000, "gpuMilli": 250, "numGpu": 1, "weight": 1},
    {"cpuMilli": 8000, "gpuMilli": 1000, "numGpu": 4, "weight": 3},
]


class Files:
    """The policy file in ``tmp_path``; every write moves its mtime on (seen within one clock tick)."""

    def __init__(self, tmp_path: Path):
        self.dir, self.policy, self.tick = tmp_path, tmp_path / "policy.yaml", 0

    def write(self, text: str) -> None:
        self.policy.write_text(text)
        self.tick += 1
        st = self.policy.stat()
        os.utime(self.policy, ns=(st.st_atime_ns, st.st_mtime_ns + self.tick * 1_000_000_000))


def reloads(metrics: Metrics, result: str) -> float:
    return metrics.registry.get_sample_value("rlsched_extender_policy_reloads_total", {"result": result}) or 0.0


def engine(files: Files, metrics: Metrics | None = None, **settings: Any) -> PolicyEngine:
    e = PolicyEngine(PolicySettings(**settings), str(files.policy), metrics=metrics)
    e.start(strict_model=False)
    return e


# -- typicalPodsPath ---------------------------------------------------------------------------------


def test_a_fifo_as_typical_pods_path_is_refused_without_stalling_the_event_loop(tmp_path: Path) -> None:
    """The typical pods file was opened and read on the event loop: a FIFO named in a hot-reloaded
    policy file stalled every verb until something wrote to it (here after 2 s; in life, never)."""
    files, metrics = Files(tmp_path), Metrics()
    files.write("mode: active\n")
    e = engine(files, metrics)
    fifo = tmp_path / "typical.fifo"
    os.mkfifo(fifo)
    stop = threading.Event()

    def writer() -> None:  # unblocks a reader that waits on the FIFO, so that the old code ends too
        if stop.wait(2.0):
            return
        while not stop.is_set():
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader yet
                time.sleep(0.02)
                continue
            os.write(fd, json.dumps(ONE_GROUP).encode())
            os.close(fd)
            return

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        files.write(f"mode: shadow\ntypicalPodsPath: {fifo}\n")
        start = time.monotonic()
        asyncio.run(e.poll())
        took = time.monotonic() - start
    finally:
        stop.set()
        thread.join(5)
    assert took < 1.0, f"poll took {took:.2f} s"
    assert "not a regular file" in (e.settings_error or "")
    assert e.settings.mode == "active" and e.status()["typicalPods"] == {"source": "built-in", "count": 35}
    assert reloads(metrics, "error") == 1


def test_a_typical_pods_file_over_the_cap_is_refused_unread(tmp_path: Path) -> None:
    """A typical pods file of any size was read whole (the policy file is capped at 256 KiB, a model
    at MAX_MODEL_BYTES): a refusal is counted, and the previous typical pods stay."""
    files, metrics = Files(tmp_path), Metrics()
    good = tmp_path / "good.json"
    good.write_text(json.dumps(TWO_GROUPS))
    files.write(f"typicalPodsPath: {good}\n")
    e = engine(files, metrics)
    assert e.status()["typicalPods"] == {"source": str(good), "count": 2}
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"typicalPods": ONE_GROUP, "padding": "x" * (2 << 20)}))  # over MAX_TYPICAL_BYTES
    files.write(f"mode: shadow\ntypicalPodsPath: {big}\n")
    asyncio.run(e.poll())
    assert "larger than" in (e.settings_error or "") and reloads(metrics, "error") == 1
    assert e.settings.mode == "active" and e.status()["typicalPods"] == {"source": str(good), "count": 2}


def test_the_typical_pods_file_is_read_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """poll read the typical pods file named by a new policy file on the event loop's thread."""
    path = tmp_path / "typical.json"
    path.write_text(json.dumps(TWO_GROUPS))
    files = Files(tmp_path)
    files.write("mode: active\n")
    e = engine(files)
    threads: list[threading.Thread] = []
    real = policy_module.load_typical

    def recording(p: str) -> TypicalPods:
        threads.append(threading.current_thread())
        return real(p)

    monkeypatch.setattr(policy_module, "load_typical", recording)
    files.write(f"typicalPodsPath: {path}\n")
    asyncio.run(e.poll())
    assert threads and threading.main_thread() not in threads
    assert e.settings_error is None and e.status()["typicalPods"] == {"source": str(path), "count": 2}


def test_a_new_fallback_is_built_and_warmed_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy file that changes the fallback had it built and warmed up (~150 ms for FGD the first
    time) on the event loop; now a worker thread prepares it before the file takes effect."""
    files = Files(tmp_path)
    files.write("fallback: least-allocated\n")
    e = engine(files)
    threads: list[threading.Thread] = []
    real = policy_module.warm_up

    def recording(scorer: Any) -> None:
        threads.append(threading.current_thread())
        real(scorer)

    monkeypatch.setattr(policy_module, "warm_up", recording)
    files.write("fallback: fgd\n")
    asyncio.run(e.poll())
    assert e.fallback_scorer.name == "fgd" and threads and threading.main_thread() not in threads


def test_devices_are_not_typical_pods_files(tmp_path: Path) -> None:
    """Guard (not a regression test: the old code would read /dev/zero until memory ran out): a device
    or a FIFO is refused before anything is read, a missing file says so."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    paths = [str(fifo)] + [d for d in ("/dev/zero", "/dev/null") if os.path.exists(d)]
    for path in paths:
        with pytest.raises(ConfigError, match="not a regular file"):
            load_typical(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_typical(str(tmp_path / "missing.json"))


def test_a_fifo_named_at_start_does_not_block_start_up(tmp_path: Path) -> None:
    """Guard: start reads the typical pods file on its own thread (before the loop serves); a FIFO there
    is refused at once, and the extender starts on its base settings."""
    fifo = tmp_path / "typical.fifo"
    os.mkfifo(fifo)
    files = Files(tmp_path)
    files.write(f"mode: shadow\ntypicalPodsPath: {fifo}\n")
    e = engine(files)
    assert "not a regular file" in (e.settings_error or "") and e.settings.mode == "active"


# -- the typical pods of a new model -------------------------------------------------------------------


class Model(FgdScorer):
    """A scorer that exposes the typical pods it was trained with (as a model's manifest does)."""

    name = "ppo"

    def __init__(self, typical: TypicalPods, version: str):
        super().__init__(typical)
        self.version = version


def spec_loader(path: str, typical: Any) -> Model:
    spec = json.loads(Path(path).read_text())
    return Model(TypicalPods.from_json(spec["typicalPods"]), spec["version"])


def test_the_fallback_takes_the_typical_pods_of_the_model_that_replaces_another(tmp_path: Path) -> None:
    """Model A → model B with other typical pods: the FGD fallback and /status kept A's, because only
    the pods' source ("model" both times) was compared."""
    files = Files(tmp_path)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"version": "A", "typicalPods": ONE_GROUP}))
    b.write_text(json.dumps({"version": "B", "typicalPods": TWO_GROUPS}))
    files.write(f"modelPath: {a}\n")
    e = PolicyEngine(PolicySettings(), str(files.policy), spec_loader)
    e.start()
    assert e.status()["typicalPods"] == {"source": "model", "count": 1}
    files.write(f"modelPath: {b}\n")
    asyncio.run(e.poll())
    assert e.model_info.version == "B"
    assert e.status()["typicalPods"] == {"source": "model", "count": 2}
    fallback_typical = e.fallback_scorer.typical  # type: ignore[attr-defined]
    assert fallback_typical.to_json() == TypicalPods.from_json(TWO_GROUPS).to_json()


def test_the_same_model_file_rewritten_with_other_typical_pods_moves_the_fallback(tmp_path: Path) -> None:
    """The model file in effect replaced in place (same policy file) by one with other typical pods:
    the fallback follows them too."""
    files = Files(tmp_path)
    m = tmp_path / "m.json"
    m.write_text(json.dumps({"version": "A", "typicalPods": ONE_GROUP}))
    files.write(f"modelPath: {m}\n")
    e = PolicyEngine(PolicySettings(), str(files.policy), spec_loader)
    e.start()
    m.write_text(json.dumps({"version": "B", "typicalPods": TWO_GROUPS}))
    st = m.stat()
    os.utime(m, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    asyncio.run(e.poll())
    assert e.model_info.version == "B" and e.status()["typicalPods"] == {"source": "model", "count": 2}
    assert len(e.fallback_scorer.typical) == 2  # type: ignore[attr-defined]


# -- seed ------------------------------------------------------------------------------------------------


def test_seed_in_the_policy_file_is_ignored_loudly(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``seed`` in the policy file was accepted and shown in the settings in effect, but never applied:
    the cache's node tie-break order comes from the start-up config. Now the settings keep the
    start-up seed, and a policy file's other seed is logged and counted; the rest of the file applies."""
    files, metrics = Files(tmp_path), Metrics()
    files.write("seed: 7\n")
    with caplog.at_level(logging.WARNING, logger="rlsched.extender.policy"):
        e = engine(files, metrics, seed=3)
        assert e.settings.seed == 3 and reloads(metrics, "key-ignored") == 1
        files.write("mode: shadow\nseed: 9\n")
        asyncio.run(e.poll())
    assert e.settings.mode == "shadow" and e.settings.seed == 3
    assert reloads(metrics, "key-ignored") == 2 and e.settings_error is None
    assert sum("seed 9 ignored" in r.getMessage() for r in caplog.records) == 1
    files.write("mode: off\nseed: 3\n")  # the start-up seed again: nothing to say
    asyncio.run(e.poll())
    assert e.settings.mode == "off" and reloads(metrics, "key-ignored") == 2
