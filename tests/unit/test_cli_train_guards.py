"""``rlsched train`` refuses, before iteration 0, what only failed after the work before: NaN settings,
negative seeds, an out-of-range inflation target, output paths it cannot write, a start model that is a
folder; and a ``--resume`` file that is no checkpoint is one line, not an unpickling traceback."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest
from ppo_fixtures import write_workload

from rlsched.cli import main as rlsched_main

TINY = ["--num-envs", "1", "--num-steps", "8", "--num-minibatches", "1", "--max-iterations", "1", "--no-progress"]


def refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = rlsched_main(["train", *argv])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert err.startswith("rlsched train: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--seed", "-1"], "--seed: seeds are whole numbers from 0 to 2**63 - 1, got -1"),
        (["--val-seeds", "-5"], "--val-seeds: seeds are whole numbers from 0"),
        (["--train-seed0", "-3"], "--train-seed0: seeds are whole numbers from 0"),
        (["--es-sigma", "nan"], "--es-sigma must be a finite number, got nan"),
        (["--learning-rate", "inf"], "--learning-rate must be a finite number, got inf"),
        (["--target", "nan"], "--target must be a finite number, got nan"),
        (["--target", "1e9"], "--target must be at least 1.0 and at most 10"),
        (["--workers", "100000"], "--workers must be 0 (one per core) to 256, got 100000"),
        (["--workers", "-1"], "--workers must be 0 (one per core) to 256, got -1"),
        (["--init", "{dir}"], "--init-model {dir}: is a folder; give a file"),
        (["--export", "{dir}"], "--export {dir}: is a folder; give a file path"),
        (["--out-dir", "{nodes}"], "--out-dir {nodes}: is a file, not a folder"),
    ],
)
def test_train_refuses_before_it_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    nodes, pods = write_workload(tmp_path / "w")
    folder = tmp_path / "adir"
    folder.mkdir()
    fill = {"dir": str(folder), "nodes": nodes}
    base = ["--nodes", nodes, "--traces", pods, "--out-dir", str(tmp_path / "runs"), *TINY]
    err = refused(capsys, [*base, *(f.format(**fill) for f in flags)])
    assert message.format(**fill) in err
    assert not (tmp_path / "runs").exists(), "refused before any run folder is made"


def test_resume_from_a_file_that_is_no_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    nodes, pods = write_workload(tmp_path / "w")
    base = ["--nodes", nodes, "--traces", pods, "--out-dir", str(tmp_path / "runs"), "--method", "ppo", *TINY]
    for name, content in (("text.pt", b"not a model\n"), ("empty.pt", b""), ("zip.pt", b"PK\x03\x04broken")):
        bad = tmp_path / name
        bad.write_bytes(content)
        err = refused(capsys, [*base, "--resume", str(bad)])
        assert err.startswith(f"rlsched train: --resume {bad}: not a PPO checkpoint (")


def test_resume_from_a_pickle_that_is_no_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    nodes, pods = write_workload(tmp_path / "w")
    other = tmp_path / "other.pt"
    torch.save({"weights": [1, 2, 3]}, other)
    base = ["--nodes", nodes, "--traces", pods, "--out-dir", str(tmp_path / "runs"), "--method", "ppo", *TINY]
    err = refused(capsys, [*base, "--resume", str(other)])
    assert "not a PPO checkpoint (no agent, optimizer, torch_rng, history, iteration)" in err


def test_a_checkpoint_from_before_the_settings_were_kept_still_loads(tmp_path: Path) -> None:
    """Checkpoints hold their run's settings (``args``) only since a recent change; an older one resumes
    with the invocation's settings (ppo.config.resumed_args), so the check must not ask for them."""
    torch = pytest.importorskip("torch")
    from rlsched.policy.ppo.trainer import load_checkpoint

    older = tmp_path / "older.pt"
    torch.save({"agent": {}, "optimizer": {}, "torch_rng": None, "history": [], "iteration": 3}, older)
    assert load_checkpoint(older)["iteration"] == 3


def test_a_resumed_run_does_not_check_an_out_dir_it_does_not_use(tmp_path: Path) -> None:
    """A resumed run writes into its checkpoint's folder; --out-dir (or its default) under a file was
    refused although the run would never write there."""
    from rlsched.policy.cli_train import add_arguments, build_args

    nodes, pods = write_workload(tmp_path / "w")
    checkpoint = tmp_path / "checkpoint.pt"
    checkpoint.write_bytes(b"read later")
    blocker = tmp_path / "runs"
    blocker.write_text("a file where a folder would go")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = ["--nodes", nodes, "--traces", pods, "--method", "ppo", "--out-dir", str(blocker / "train"), *TINY]
    with pytest.raises(ValueError, match="is a file, not a folder"):
        build_args(parser.parse_args(argv))
    assert build_args(parser.parse_args([*argv, "--resume", str(checkpoint)])).resume == str(checkpoint)


def test_an_export_that_fails_after_training_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from rlsched.policy import cli_train
    from rlsched.policy.ppo.config import TrainResult

    def disk_full(*_args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shutil, "copyfile", disk_full)
    ns = type("NS", (), {"export": str(tmp_path / "exported.npz")})()
    result = TrainResult(str(tmp_path / "best.npz"), 1.0, 1.0, 8, 1.0, str(tmp_path))
    assert cli_train._report(ns, "ppo", result) == 2  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert "--export" in err and "No space left on device" in err and str(tmp_path / "best.npz") in err


def test_a_pod_larger_than_the_target_is_refused_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 4-card pod on a 2-card cluster would leave no GPU pod in the arrivals: refused in one line, not
    as a worker's traceback."""
    nodes, pods = tmp_path / "nodes.yaml", tmp_path / "pods.yaml"
    nodes.write_text("nodes:\n  - {name: box, cpu: 32, memory: 128Gi, gpus: 2, gpuModel: T4}\n")
    pods.write_text("pods:\n  - {name: big, cpu: 16, memory: 64Gi, gpus: 4}\n  - {name: web, cpu: 1, memory: 1Gi}\n")
    base = ["--nodes", str(nodes), "--traces", str(pods), "--out-dir", str(tmp_path / "runs"), *TINY]
    err = refused(capsys, base)
    assert "pod 'big' alone asks for 4 GPUs, more than 1.3 × the cluster's GPU capacity (2 GPUs)" in err
    assert not (tmp_path / "runs").exists()


def test_train_warns_about_pods_that_fit_no_node(tmp_path: Path) -> None:
    from ppo_fixtures import tiny_args

    from rlsched.policy.cli_train import check_inputs

    args = tiny_args(tmp_path / "w")
    typo = tmp_path / "typo.yaml"
    typo.write_text("pods:\n  - {name: a, cpu: 1, memory: 1Gi, gpus: 1, gpuModels: v100m16}\n")
    args = dataclasses.replace(args, traces=(*args.traces, str(typo)))
    lines: list[str] = []
    check_inputs(args, warn=lines.append)
    assert len(lines) == 1 and lines[0].startswith(f"{typo}: 1 of 1 pods fit no node") and "'a'" in lines[0]
