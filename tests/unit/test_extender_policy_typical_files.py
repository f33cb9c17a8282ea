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


def active_engine(tmp_path: Path) -> tuple[Files, Metrics, PolicyEngine]:
    """An engine started from a policy file that says ``mode: active``, and its files and metrics."""
    files, metrics = Files(tmp_path), Metrics()
    files.write("mode: active\n")
    return files, metrics, engine(files, metrics)


# -- typicalPodsPath ---------------------------------------------------------------------------------


def test_a_fifo_as_typical_pods_path_is_refused_without_stalling_the_event_loop(tmp_path: Path) -> None:
    """The typical pods file was opened and read on the event loop: a FIFO named in a hot-reloaded
    policy file stalled every verb until something wrote to it (here after 2 s; in life, never)."""
    files, metrics, e = active_engine(tmp_path)
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


def threads_calling(monkeypatch: pytest.MonkeyPatch, name: str) -> list[threading.Thread]:
    """``policy_module.<name>`` wrapped: the thread of each call is appended to the list returned."""
    threads: list[threading.Thread] = []
    real = getattr(policy_module, name)

    def recording(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(policy_module, name, recording)
    return threads


def test_the_typical_pods_file_is_read_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """poll read the typical pods file named by a new policy file on the event loop's thread."""
    path = tmp_path / "typical.json"
    path.write_text(json.dumps(TWO_GROUPS))
    files = Files(tmp_path)
    files.write("mode: active\n")
    e = engine(files)
    threads = threads_calling(monkeypatch, "load_typical")
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
    threads = threads_calling(monkeypatch, "warm_up")
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


# -- files that defeat a parser, and any other error reading the policy file ----------------------------


def test_a_deeply_nested_typical_pods_file_rejects_its_policy_file(tmp_path: Path) -> None:
    """400 KB of ``[[[…]]]`` (under MAX_TYPICAL_BYTES) made json.loads raise RecursionError, which no
    handler caught: poll raised after recording the file as seen (never applied nor retried, no
    settings_error, nothing counted), and start(strict_model=False) raised it too (a crash loop)."""
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_typical(str(deep))
    files, metrics, e = active_engine(tmp_path)
    files.write(f"mode: shadow\ntypicalPodsPath: {deep}\n")
    asyncio.run(e.poll())
    assert "nested too deeply" in (e.settings_error or "") and reloads(metrics, "error") == 1
    assert e.settings.mode == "active" and e.pending is None
    assert e.status()["typicalPods"] == {"source": "built-in", "count": 35}
    at_start = engine(files)  # strictModel false: the extender starts on its base settings
    assert "nested too deeply" in (at_start.settings_error or "") and at_start.settings.mode == "active"


def test_a_deeply_nested_policy_file_is_rejected(tmp_path: Path) -> None:
    """The policy file's YAML nested a few hundred deep made the YAML loader raise RecursionError: the
    same escape from poll and start as a deeply nested typical pods file."""
    files, metrics, e = active_engine(tmp_path)
    files.write("mode: shadow\nx: " + "[" * 5_000 + "]" * 5_000 + "\n")
    asyncio.run(e.poll())
    assert "nested too deeply" in (e.settings_error or "") and reloads(metrics, "error") == 1
    assert e.settings.mode == "active" and e.pending is None
    at_start = engine(files)
    assert "nested too deeply" in (at_start.settings_error or "") and at_start.settings.mode == "active"


def test_any_error_reading_the_policy_file_is_a_policy_file_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Only ConfigError was handled: anything else raised while reading the file escaped poll after it
    was recorded as seen, so the file was neither applied nor retried and /status showed nothing. Now it
    is reported like any bad file (shown, counted, logged once) and the previous settings stay."""
    files, metrics, e = active_engine(tmp_path)
    real = policy_module.load_policy_file

    def broken(path: Any, base: PolicySettings) -> PolicySettings:
        raise RuntimeError("the reader broke")

    monkeypatch.setattr(policy_module, "load_policy_file", broken)
    files.write("mode: shadow\n")
    with caplog.at_level(logging.ERROR, logger="rlsched.extender.policy"):
        asyncio.run(e.poll())
        asyncio.run(e.poll())  # the same file: not read again, not counted again
    assert "RuntimeError: the reader broke" in (e.settings_error or "")
    assert reloads(metrics, "error") == 1 and e.settings.mode == "active" and e.pending is None
    assert sum("policy file not applied" in r.getMessage() for r in caplog.records) == 1
    at_start = PolicyEngine(PolicySettings(), str(files.policy), metrics=Metrics())
    at_start.start(strict_model=False)
    assert "RuntimeError" in (at_start.settings_error or "") and at_start.settings.mode == "active"
    monkeypatch.setattr(policy_module, "load_policy_file", real)
    files.write("mode: off\n")
    asyncio.run(e.poll())
    assert e.settings.mode == "off" and e.settings_error is None


# -- the cost of large typical pods files ----------------------------------------------------------------


def groups(n: int) -> list[dict[str, Any]]:
    return [{"cpuMilli": 1000 + i, "gpuMilli": 1000, "numGpu": 1 + i % 8, "weight": 1} for i in range(n)]


def test_a_typical_pods_file_with_too_many_groups_is_refused(tmp_path: Path) -> None:
    """~12,500 groups fit in MAX_TYPICAL_BYTES, and each FGD fallback decision then took 25–45 ms at 500
    nodes (0.2–0.5 ms with the built-in 35): a file may list at most MAX_TYPICAL_GROUPS."""
    cap = policy_module.MAX_TYPICAL_GROUPS
    most, over = tmp_path / "most.json", tmp_path / "over.json"
    most.write_text(json.dumps(groups(cap)))
    over.write_text(json.dumps({"typicalPods": groups(cap + 1)}))
    assert len(load_typical(str(most))) == cap
    with pytest.raises(ConfigError, match=f"at most {cap:,}"):
        load_typical(str(over))
    files, metrics, e = active_engine(tmp_path)
    files.write(f"mode: shadow\ntypicalPodsPath: {over}\n")
    asyncio.run(e.poll())
    assert f"at most {cap:,}" in (e.settings_error or "") and reloads(metrics, "error") == 1
    assert e.settings.mode == "active" and e.status()["typicalPods"] == {"source": "built-in", "count": 35}
    files.write(f"mode: shadow\ntypicalPodsPath: {most}\n")
    asyncio.run(e.poll())
    assert e.settings.mode == "shadow" and e.status()["typicalPods"] == {"source": str(most), "count": cap}


def test_the_typical_pods_digest_is_computed_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback is keyed by the digest of its typical pods; for a typical pods file it was computed
    on the event loop, twice per reload (~33 ms each for a file near MAX_TYPICAL_BYTES). Now the worker
    that reads the file computes it."""
    path = tmp_path / "typical.json"
    path.write_text(json.dumps(groups(200)))
    files = Files(tmp_path)
    files.write("mode: active\n")
    e = engine(files)
    threads = threads_calling(monkeypatch, "typical_digest")
    files.write(f"typicalPodsPath: {path}\n")
    asyncio.run(e.poll())
    assert e.status()["typicalPods"] == {"source": str(path), "count": 200}
    assert len(e.fallback_scorer.typical) == 200  # type: ignore[attr-defined]
    assert threads and threading.main_thread() not in threads


def test_a_policy_file_that_drops_the_model_prepares_its_fallback_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file without modelPath after a model with its own typical pods: the fallback was prepared for
    the model's pods (the model in effect), so the built-in pods' fallback was built and warmed on the
    event loop when the file took effect."""
    files = Files(tmp_path)
    m = tmp_path / "m.json"
    m.write_text(json.dumps({"version": "A", "typicalPods": ONE_GROUP}))
    files.write(f"modelPath: {m}\n")
    e = PolicyEngine(PolicySettings(), str(files.policy), spec_loader)
    e.start()
    assert e.status()["typicalPods"] == {"source": "model", "count": 1}
    threads = threads_calling(monkeypatch, "warm_up")
    files.write("mode: active\n")
    asyncio.run(e.poll())
    assert e.model is None and e.status()["typicalPods"] == {"source": "built-in", "count": 35}
    assert threads and threading.main_thread() not in threads
