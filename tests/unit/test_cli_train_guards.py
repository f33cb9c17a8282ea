"""``rlsched train`` refuses, before iteration 0, what only failed after the work before: NaN settings,
negative seeds, an out-of-range inflation target, zero counts and other out-of-range settings, output paths
it cannot write, a start model that is a folder, a model version too long to export, traces no simulation
plays, vine where it cannot branch; a ``--resume`` file that is no checkpoint is one line, not an unpickling
traceback; and a failed ``--export`` leaves what was at the destination as it was."""

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
        # counts a loop divides or iterates by, checked before the run rather than failing in it
        (["--update-epochs", "0"], "--update-epochs must be at least 1, got 0"),
        (["--checkpoint-every", "0"], "--checkpoint-every must be at least 1, got 0"),
        (["--torch-threads", "0"], "--torch-threads must be at least 1, got 0"),
        (["--advantage", "vine", "--vine-points", "0"], "--vine-points must be at least 1, got 0"),
        (["--advantage", "vine", "--vine-trunks", "0"], "--vine-trunks must be at least 1, got 0"),
        (["--advantage", "vine", "--vine-actions", "0"], "--vine-actions must be at least 1, got 0"),
        (["--hidden", "64"], "--hidden takes two layer widths of at least 1, got 64"),
        (["--hidden", "8", "8", "8"], "--hidden takes two layer widths of at least 1, got 8 8 8"),
        (["--learning-rate", "-0.001"], "--learning-rate must be more than 0, got -0.001"),
        (["--learning-rate", "0"], "--learning-rate must be more than 0, got 0.0"),
        # the served decision rule refuses a negative rank weight: the model would train, then never load
        (["--rank-scale", "-5"], "--rank-scale must be 0 or more (a served model's rank weight is never negative)"),
        # vine branches FGD-protocol episodes at placement decisions: nothing else to branch
        (["--advantage", "vine", "--allow-delay"], "--advantage vine branches placement decisions only, not the delay"),
        (
            ["--advantage", "vine", "--allow-reject"],
            "--advantage vine branches placement decisions only, not the reject",
        ),
        (["--advantage", "vine", "--mode", "dynamic"], "--advantage vine branches FGD-protocol episodes only"),
        # a trace beyond the simulations would never be played, while the manifest names it
        (["--traces", "{pods}", "{pods}"], "2 traces but --num-envs 1: each simulation plays one trace, so 1 would"),
        (
            ["--advantage", "vine", "--vine-trunks", "1", "--num-envs", "4", "--traces", "{pods}", "{pods}"],
            "2 traces but --vine-trunks 1: each simulation plays one trace, so 1 would never be trained on; raise "
            "--vine-trunks to at least 2",
        ),
        # a model version over 128 characters was refused only at the export, after the run
        (["--model-version", "v" * 129], "--model-version would be 129 characters"),
        (
            ["--exp-name", "x" * 119, "--total-timesteps", "360000"],  # x…x-s1-360000 at the last step
            "the default model version <exp_name>-s<seed>-<steps> would be 129 characters",
        ),
    ],
)
def test_train_refuses_before_it_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    nodes, pods = write_workload(tmp_path / "w")
    folder = tmp_path / "adir"
    folder.mkdir()
    fill = {"dir": str(folder), "nodes": nodes, "pods": pods}
    base = ["--nodes", nodes, "--traces", pods, "--out-dir", str(tmp_path / "runs"), *TINY]
    err = refused(capsys, [*base, *(f.format(**fill) for f in flags)])
    assert message.format(**fill) in err
    assert not (tmp_path / "runs").exists(), "refused before any run folder is made"


def test_the_longest_model_version_a_model_carries_is_accepted(tmp_path: Path) -> None:
    """128 characters, the most a model file carries, at the run's last step: 118 + ``-s1-360000``."""
    from rlsched.policy.cli_train import add_arguments, build_args

    nodes, pods = write_workload(tmp_path / "w")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = ["--nodes", nodes, "--traces", pods, "--out-dir", str(tmp_path / "runs"), *TINY]
    args = build_args(parser.parse_args([*argv, "--exp-name", "x" * 118, "--total-timesteps", "360000"]))
    assert len(f"{args.exp_name}-s{args.seed}-{args.total_timesteps}") == 128
    assert build_args(parser.parse_args([*argv, "--model-version", "v" * 128])).model_version == "v" * 128


def test_vine_refuses_a_start_model_that_delays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A start model trained with the delay action turns it on (ppo.config.settings_of_init_model), which
    vine cannot branch: refused before the run, by ``rlsched train`` and by the API alike."""
    pytest.importorskip("torch")
    from ppo_fixtures import small_typical, tiny_args

    from rlsched.policy.export import build_manifest, save_model
    from rlsched.policy.features import CLUSTER_FEATURES, FEATURES
    from rlsched.policy.ppo import train
    from rlsched.policy.ppo.agent import Agent

    nodes, pods = write_workload(tmp_path / "w")
    model = tmp_path / "delays.npz"
    arrays = Agent(len(FEATURES), len(CLUSTER_FEATURES), (16, 16), 16, 50.0).to_arrays()
    manifest = build_manifest(
        version="start",
        hidden=(16, 16),
        value_hidden=16,
        prior_scale=50.0,
        rank_scale=20.0,
        mode="greedy",
        fgd_cpu_weight=0.8,
        typical_json=small_typical().to_json(),
        training={},
        allow_delay=True,
    )
    save_model(model, arrays, manifest)
    base = ["--nodes", nodes, "--traces", pods, "--out-dir", str(tmp_path / "runs"), *TINY]
    err = refused(capsys, [*base, "--method", "ppo", "--advantage", "vine", "--init", str(model)])
    assert f"--init-model {model}: --advantage vine branches placement decisions only, not the delay action" in err
    assert not (tmp_path / "runs").exists()
    with pytest.raises(ValueError, match="not the delay action"):
        train(tiny_args(tmp_path / "api", advantage="vine", init_model=str(model)))


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


def test_an_export_that_fails_leaves_the_model_there_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--export over a model in use: a copy that dies midway (a full disk) used to leave it truncated; now
    both files are copied beside their destinations first and renamed over them only once both are whole."""
    import shutil

    from rlsched.policy import cli_train
    from rlsched.policy.ppo.config import TrainResult

    run, served = tmp_path / "run", tmp_path / "served"
    run.mkdir()
    served.mkdir()
    (run / "best.npz").write_bytes(b"new model " * 100)
    (run / "best.json").write_text('{"version": "new"}')
    dest = served / "model.npz"
    dest.write_bytes(b"old model " * 100)
    dest.with_suffix(".json").write_text('{"version": "old"}')
    ns = type("NS", (), {"export": str(dest)})()
    result = TrainResult(str(run / "best.npz"), 1.0, 1.0, 8, 1.0, str(run))
    real_copy = shutil.copyfile

    def dies_midway(src: str, dst: str, *_args: object, **_kw: object) -> None:
        Path(dst).write_bytes(Path(src).read_bytes()[:7])
        raise OSError(28, "No space left on device")

    def dies_at_the_manifest(src: str, dst: str, *args: object, **kw: object) -> object:
        if str(src).endswith(".json"):
            dies_midway(src, dst)
        return real_copy(src, dst, *args, **kw)  # type: ignore[arg-type]

    for broken in (dies_midway, dies_at_the_manifest):
        monkeypatch.setattr(shutil, "copyfile", broken)
        assert cli_train._report(ns, "ppo", result) == 2  # type: ignore[arg-type]
        assert "No space left on device" in capsys.readouterr().err
        assert dest.read_bytes() == b"old model " * 100, broken.__name__
        assert dest.with_suffix(".json").read_text() == '{"version": "old"}', broken.__name__
        assert sorted(p.name for p in served.iterdir()) == ["model.json", "model.npz"], "no temporary file left"
    monkeypatch.setattr(shutil, "copyfile", real_copy)
    assert cli_train._report(ns, "ppo", result) == 0  # type: ignore[arg-type]
    assert dest.read_bytes() == b"new model " * 100
    assert dest.with_suffix(".json").read_text() == '{"version": "new"}'
    assert sorted(p.name for p in served.iterdir()) == ["model.json", "model.npz"]


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
