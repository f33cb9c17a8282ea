"""``rlsched train-delay`` and ``rlsched train-rebalancer`` refuse what their search cannot use before any
worker starts — one line naming the flag or file, exit 2 — and train-delay stops plainly when no pod
ever waits. (Both searches run for minutes to hours; a traceback at the end wastes all of it.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from openb_files import write_openb
from test_dynamic_rebalancing import NODES, PODS
from test_learned import write_model

from rlsched.cli import main as rlsched_main
from rlsched.policy.dynamic.delay_search import DEFAULT_START_MODEL, DelaySearchSettings, NoWaitError, search

TINY = ["--generations", "1", "--population", "2", "--elites", "1", "--val-seeds", "7", "--workers", "1"]


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, str]:
    nodes, pods = write_openb(tmp_path, NODES, PODS)
    untimed = tmp_path / "untimed.csv"
    untimed.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,500\n")
    broken = tmp_path / "broken.csv"
    broken.write_text("name,cpu_milli\n")
    folder = tmp_path / "adir"
    folder.mkdir()
    return {
        "nodes": str(nodes),
        "pods": str(pods),
        "untimed": str(untimed),
        "broken": str(broken),
        "dir": str(folder),
        "model": str(write_model(tmp_path / "start.npz")),
        "junk": str(broken),
        "out": str(tmp_path / "out" / "result.npz"),
    }


def refused(capsys: pytest.CaptureFixture[str], command: str, argv: list[str]) -> str:
    code = rlsched_main([command, *argv])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert err.startswith(f"rlsched {command}: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


CASES = [
    (["--pods", "{broken}"], "{broken}:1: header lacks column(s)"),
    (["--pods", "{untimed}"], "needs creation_time and deletion_time on every pod"),
    (["--policy", "nosuch"], "unknown policy 'nosuch'"),
    (["--objective-from", "{nodes}"], "{nodes}"),
    (["--window-s", "-1"], "--window-s must be in (0, 604800] seconds"),
    (["--window-s", "nan"], "--window-s must be a finite number, got nan"),
    (["--workers", "0"], "--workers must be 1 to 256, got 0"),
    (["--seed", "-1"], "--seed: seeds are whole numbers from 0"),
    (["--val-seeds", "-5"], "--val-seeds: seeds are whole numbers from 0"),
    (["--smoothing", "nan"], "--smoothing must be a finite number"),
    (["--out", "{dir}"], "--out {dir}: is a folder; give a file path"),
    (["--out", "{nodes}/x.npz"], "{nodes} is a file, not a folder"),
    (["--nodes", "{dir}"], "--nodes {dir}: is a folder; give a file"),
]


@pytest.mark.parametrize("flags, message", CASES)
def test_train_delay_refuses_before_the_search(
    capsys: pytest.CaptureFixture[str], inputs: dict[str, str], flags: list[str], message: str
) -> None:
    base = ["--nodes", inputs["nodes"], "--pods", inputs["pods"], "--start-model", inputs["model"]]
    base += ["--out", inputs["out"], *TINY]
    err = refused(capsys, "train-delay", [*base, *(f.format(**inputs) for f in flags)])
    assert message.format(**inputs) in err
    assert not Path(inputs["out"]).exists()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--start-model", "{junk}"], "not a readable .npz model"),
        (["--start-model", "{dir}"], "--start-model {dir}: is a folder"),
        (["--loads", "0"], "loads in (0, 10]"),
        (["--hold-s", "7200"], "need hold-s in (0, 3600]"),
        (["--train-seed0", "0"], "--train-seed0 must be at least 1"),
    ],
)
def test_train_delay_refuses_its_own_settings(
    capsys: pytest.CaptureFixture[str], inputs: dict[str, str], flags: list[str], message: str
) -> None:
    base = ["--nodes", inputs["nodes"], "--pods", inputs["pods"], "--start-model", inputs["model"]]
    err = refused(capsys, "train-delay", [*base, "--out", inputs["out"], *TINY, *(f.format(**inputs) for f in flags)])
    assert message.format(**inputs) in err


@pytest.mark.parametrize("flags, message", [*CASES, (["--load", "0"], "--load must be in (0, 10], got 0")])
def test_train_rebalancer_refuses_before_the_search(
    capsys: pytest.CaptureFixture[str], inputs: dict[str, str], flags: list[str], message: str
) -> None:
    out = str(Path(inputs["out"]).with_suffix(".json"))
    base = ["--nodes", inputs["nodes"], "--pods", inputs["pods"], "--out", out, *TINY]
    err = refused(capsys, "train-rebalancer", [*base, *(f.format(**inputs) for f in flags)])
    assert message.format(**inputs).replace("x.npz", "x.json") in err.replace("x.npz", "x.json")
    assert not Path(out).exists()


def test_no_waiting_pod_stops_the_delay_search_plainly(
    capsys: pytest.CaptureFixture[str], inputs: dict[str, str]
) -> None:
    cfg = DelaySearchSettings(
        nodes=inputs["nodes"],
        pods=inputs["pods"],
        start_model=inputs["model"],
        loads=(0.01,),
        window_s=1.0,
        val_seeds=(7,),
        workers=1,
        out=inputs["out"],
    )
    with pytest.raises(NoWaitError, match="no pod waited at loads 0.01: .*raise --loads"):
        search(cfg, log=lambda _line: None)
    argv = ["--nodes", inputs["nodes"], "--pods", inputs["pods"], "--start-model", inputs["model"], *TINY]
    err = refused(capsys, "train-delay", [*argv, "--loads", "0.01", "--window-s", "1", "--out", inputs["out"]])
    assert "no pod waited" in err


def test_the_default_start_model_is_the_bundled_one_wherever_the_command_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # not the clone's root
    default = Path(DelaySearchSettings().start_model)
    assert default == DEFAULT_START_MODEL and default.is_absolute() and default.is_file()
    assert default.name == "ppo-openb-dynamic.npz"
