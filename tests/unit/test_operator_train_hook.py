"""``rlsched train --from-decisions``: the decision log becomes the trainer's workload."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from rlsched.operator.decisionlog import DecisionLog
from rlsched.policy.decision_dataset import prepare_fine_tune
from rlsched.policy.trace import load_pods


def write_log(path: Path) -> None:
    log = DecisionLog(path, segment_bytes=1 << 20, max_bytes=4 << 20)
    for i, (t, cpu) in enumerate([(1000.0, 4000), (1012.5, 8000)]):
        log.append(
            [
                {
                    "type": "decision",
                    "kind": "filter",
                    "epoch": "e",
                    "seq": i + 1,
                    "time": t,
                    "node": "n1",
                    "cards": [0],
                    "pod": {"uid": f"uid-{i}", "namespace": "ns", "name": "job"},
                    "features": {"pod": {"cpuMilli": cpu, "memoryMiB": 1024, "numGpu": 1, "gpuMilli": 500}},
                }
            ]
        )
    log.append([{"type": "policy", "rewardWeights": {"placed": 3.0}}])
    log.close()


def fake_trainer(monkeypatch: pytest.MonkeyPatch) -> dict:
    """A PPO trainer that records the traces it was given and stops."""
    seen: dict = {}

    def fake_train(args):
        seen["traces"] = args.traces
        raise SystemExit(0)

    fake = types.ModuleType("fake_trainer")
    fake.train = fake_train
    for name in ("rlsched.policy.ppo.trainer", "rlsched.policy.ppo.train"):
        monkeypatch.setitem(sys.modules, name, fake)
    return seen


def gpu_nodes(tmp_path: Path) -> Path:
    nodes = tmp_path / "nodes.json"
    nodes.write_text(
        json.dumps({"nodes": [{"name": "n", "cpu": "32", "memory": "64Gi", "gpus": 8, "gpuModel": "V100M16"}]})
    )
    return nodes


def test_prepare_fine_tune_writes_a_trace_the_trainer_reads(tmp_path: Path) -> None:
    write_log(tmp_path / "log")
    trace, summary = prepare_fine_tune(tmp_path / "log", tmp_path / "out")
    pods = load_pods(trace)
    assert [(p.cpu_milli, p.gpu_milli, p.creation_time) for p in pods] == [(4000, 500, 0.0), (8000, 500, 12.5)]
    assert len({p.name for p in pods}) == 2  # same pod name, two UIDs: two pods
    assert summary.placements == 2
    with pytest.raises(ValueError, match="need at least 5"):
        prepare_fine_tune(tmp_path / "log", tmp_path / "out", min_pods=5)


def test_train_cli_swaps_the_traces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from rlsched.cli import main

    write_log(tmp_path / "log")
    seen = fake_trainer(monkeypatch)
    nodes = gpu_nodes(tmp_path)
    with pytest.raises(SystemExit):
        main(
            [
                "train",
                "--from-decisions",
                str(tmp_path / "log"),
                "--nodes",
                str(nodes),
                "--traces",
                str(nodes),
                "--out-dir",
                str(tmp_path / "out"),
            ]
        )
    assert seen["traces"] == (str(tmp_path / "out" / "decisions-workload.json"),)
    assert "2 decisions (2 placements" in capsys.readouterr().err
    assert (
        main(["train", "--from-decisions", str(tmp_path / "nowhere"), "--nodes", str(nodes), "--traces", str(nodes)])
        == 2
    )


def test_from_decisions_needs_no_default_trace_where_it_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default --traces (relative to the working directory) is replaced by the log's workload, so
    it is not looked for: the documented command works from any folder."""
    from rlsched.cli import main

    write_log(tmp_path / "log")
    seen = fake_trainer(monkeypatch)
    nodes = gpu_nodes(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with pytest.raises(SystemExit):
        main(["train", "--from-decisions", str(tmp_path / "log"), "--nodes", str(nodes), "--out-dir", "out"])
    assert seen["traces"] == (str(Path("out") / "decisions-workload.json"),)
