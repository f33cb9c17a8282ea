"""``rlsched evaluate`` as a user meets it: the README's sample command, ``--json``, and the published
column only on the published setup."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from rlsched.cli import main
from rlsched.policy.evaluate import Evaluation, evaluate, format_table, paired_difference
from rlsched.policy.published import (
    PUBLISHED_PODS_FINGERPRINTS,
    PUBLISHED_UNALLOCATED_AT_100,
    fingerprint_nodes,
    published_setup,
)
from rlsched.policy.simulator import RunResult
from rlsched.policy.trace import load_nodes, load_pods


def readme_sample_command(repo_root: Path) -> list[str]:
    """The first ``rlsched evaluate`` command in README.md that reads the bundled examples/."""
    text = (repo_root / "README.md").read_text()
    joined = re.sub(r"\\\n\s*", " ", text)  # shell line continuations
    line = next(
        line.strip()
        for line in joined.splitlines()
        if line.strip().startswith("rlsched evaluate") and "examples/" in line
    )
    return shlex.split(line.split("#")[0])[1:]


def test_readme_sample_command_runs_as_written(repo_root: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    argv = readme_sample_command(repo_root)
    # As pasted, from the clone's root; only the outputs go elsewhere (they would land in runs/).
    assert "--json" in argv and "--out" in argv
    argv[argv.index("--json") + 1] = str(tmp_path / "sample.json")
    argv[argv.index("--out") + 1] = str(tmp_path / "png")
    for flag in ("--nodes", "--pods"):
        path = repo_root / argv[argv.index(flag) + 1]
        assert path.is_file() and path.stat().st_size < 8192, f"{path}: the bundled sample must stay tiny"
    monkeypatch.chdir(repo_root)
    assert main(argv + ["--jobs", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "sample.json").read_text())
    policies = [s["policy"] for s in result["summary"]]
    assert policies[:2] == ["fgd", "bestfit"] and policies[2].startswith("ppo:")
    assert (tmp_path / "png" / "evaluation.png").stat().st_size > 0
    assert not (tmp_path / "png" / "evaluation.json").exists(), "--json moves the JSON out of --out"
    assert result["published_setup"] is None and "MISS" not in out and " ok)" not in out


def test_json_defaults_to_the_out_folder(repo_root: Path, tmp_path: Path) -> None:
    nodes, pods = repo_root / "examples" / "sample-nodes.yaml", repo_root / "examples" / "sample-pods.yaml"
    assert (
        main(
            [
                "evaluate",
                "--nodes",
                str(nodes),
                "--pods",
                str(pods),
                "--policy",
                "bestfit",
                "--seeds",
                "1",
                "--jobs",
                "1",
                "--no-progress",
                "--out",
                str(tmp_path),
                "--name",
                "x",
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "x.json").read_text())["summary"][0]["policy"] == "bestfit"


def test_a_pod_list_named_like_a_published_one_gets_no_published_column(repo_root: Path, tmp_path: Path) -> None:
    """The published figures hold for the paper's node and pod lists: a file name proves nothing (the
    default trace on another node list once printed "4.77 (+5.55 MISS)")."""
    pods = tmp_path / "openb_pod_list_default.yaml"
    shutil.copy(repo_root / "examples" / "sample-pods.yaml", pods)
    evaluation = evaluate(repo_root / "examples" / "sample-nodes.yaml", pods, ["fgd"], [1], progress=False)
    assert evaluation.published_setup is None
    assert [s.published_100 for s in evaluation.summaries()] == [None]
    assert "MISS" not in format_table(evaluation)


def test_the_table_counts_seeds_won_against_the_first_policy(repo_root: Path) -> None:
    nodes, pods = repo_root / "examples" / "sample-nodes.yaml", repo_root / "examples" / "sample-pods.yaml"
    evaluation = evaluate(nodes, pods, ["random", "fgd", "random"], [1, 2, 3], progress=False)
    lines = format_table(evaluation).splitlines()
    assert lines[0].endswith("seeds better/worse/equal vs first")
    first = {r.seed: round(r.unallocated_at(100), 4) for r in evaluation.runs if r.policy == "random"}
    fgd = {r.seed: round(r.unallocated_at(100), 4) for r in evaluation.runs if r.policy == "fgd"}
    better, worse = sum(fgd[s] < first[s] for s in first), sum(fgd[s] > first[s] for s in first)
    assert lines[2].endswith("-")
    assert lines[3].endswith(f"{better}/{worse}/{3 - better - worse}")


def _run(policy: str, seed: int, unallocated: float) -> RunResult:
    return RunResult(policy, seed, {100: 100.0 - unallocated}, 10, 0, 0, 0, 1000, 0.0, 1.0)


def test_the_paired_difference_is_the_mean_of_per_seed_differences_with_its_standard_error() -> None:
    """Golden arithmetic. Seeds 1–4, b − a: −0.02, −0.01, 0, +0.03 (seed 5 only a played: left out).
    mean = 0 / 4 = 0; sample std = √((0.0004 + 0.0001 + 0 + 0.0009) / 3) = √(0.0014 / 3) = 0.021602;
    standard error = 0.021602 / √4 = 0.010801."""
    a = [4.10, 4.12, 4.15, 4.11, 4.50]
    b = [4.08, 4.11, 4.15, 4.14]
    evaluation = Evaluation("nodes", "pods", 1.3)
    evaluation.runs = [_run("a", seed, u) for seed, u in enumerate(a, 1)] + [
        _run("b", seed, u) for seed, u in enumerate(b, 1)
    ]
    paired = paired_difference(evaluation, "b", "a")
    assert (paired.better, paired.worse, paired.equal) == (2, 1, 1)
    assert paired.mean == pytest.approx(0.0, abs=1e-12)
    assert paired.standard_error == pytest.approx(0.010801, abs=1e-6)
    lines = format_table(evaluation).splitlines()
    assert "mean diff vs first ± se" in lines[0]
    assert lines[3].split()[-4:] == ["+0.0000", "±", "0.0108", "2/1/1"]
    summary = evaluation.to_json()["summary"]
    assert summary[0]["versus_first"] is None
    assert summary[1]["versus_first"] == {
        "better": 2,
        "worse": 1,
        "equal": 1,
        "mean_difference": 0.0,
        "standard_error": 0.0108,
    }
    evaluation.runs = [_run("a", 1, 4.1), _run("b", 1, 4.0)]
    single = paired_difference(evaluation, "b", "a")
    assert single.mean == pytest.approx(-0.1) and single.standard_error is None
    assert format_table(evaluation).splitlines()[3].split()[-2:] == ["-0.1000", "1/0/0"]


def test_published_fingerprints_cover_the_published_traces() -> None:
    assert set(PUBLISHED_UNALLOCATED_AT_100) <= set(PUBLISHED_PODS_FINGERPRINTS.values())


def test_published_setup_is_recognized_by_content(openb_dir: Path, tmp_path: Path) -> None:
    gpu_nodes = load_nodes(openb_dir / "openb_node_list_gpu_node.csv")
    all_nodes = load_nodes(openb_dir / "openb_node_list_all_node.csv")
    default = load_pods(openb_dir / "openb_pod_list_default.csv")
    assert published_setup(gpu_nodes, default) == "default"
    assert published_setup(gpu_nodes, load_pods(openb_dir / "openb_pod_list_gpushare60.csv")) == "gpushare60"
    assert published_setup(all_nodes, default) is None, "the published figures are for the 1,213 GPU nodes"
    assert published_setup(gpu_nodes, default[:-1]) is None
    # A renamed copy is still the published trace; order does not count.
    assert fingerprint_nodes(reversed(gpu_nodes)) == fingerprint_nodes(gpu_nodes)
    copy = tmp_path / "mine.csv"
    shutil.copy(openb_dir / "openb_pod_list_default.csv", copy)
    assert published_setup(gpu_nodes, load_pods(copy)) == "default"


@pytest.mark.parametrize("flag", ["--json", "--out"])
def test_help_names_the_outputs(flag: str, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["evaluate", "--help"])
    assert flag in capsys.readouterr().out
