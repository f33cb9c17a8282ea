"""``rlsched evaluate`` on hostile or odd input: bounded inflation, a headline that says when arrivals never
reached 100 %, seeds parsed in linear time, pods that can never run named, outputs checked before the runs,
and dynamic-mode numbers that must be finite."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from rlsched.cli import main as rlsched_main
from rlsched.policy import NodeSpec, PodSpec, inflate
from rlsched.policy.evaluate import MAX_SEEDS, parse_seeds, unplaceable_note
from rlsched.policy.workload import MAX_ARRIVALS, check_inflatable, target_problem

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
NODES = NODE_HEADER + "n0,64000,262144,8,V100M32\nn1,64000,262144,2,T4\n"
PODS = POD_HEADER + "p0,4000,8192,1,1000,\np1,2000,4096,1,500,\np2,8000,16384,2,1000,\n"


def files(tmp_path: Path, nodes: str = NODES, pods: str = PODS) -> tuple[str, str]:
    (tmp_path / "nodes.csv").write_text(nodes)
    (tmp_path / "pods.csv").write_text(pods)
    return str(tmp_path / "nodes.csv"), str(tmp_path / "pods.csv")


def evaluate(capsys: pytest.CaptureFixture[str], tmp_path: Path, *argv: str) -> tuple[int, str, str]:
    jobs = [] if "events" in argv else ["--jobs", "1"]  # --jobs does nothing in events mode, and says so
    code = rlsched_main(
        ["evaluate", "--policy", "fgd", "--seeds", "1", *jobs, "--no-progress", "--out", str(tmp_path / "o"), *argv]
    )
    out, err = capsys.readouterr()
    if code == 2:
        assert err.startswith("rlsched evaluate: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return code, out, err


@pytest.mark.parametrize("target", ["inf", "nan", "1e9", "10.5", "-inf"])
def test_a_target_that_is_not_a_sane_finite_fraction_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, target: str
) -> None:
    nodes, pods = files(tmp_path)
    started = time.monotonic()
    code, _, err = evaluate(capsys, tmp_path, "--nodes", nodes, "--pods", pods, f"--target={target}")
    assert code == 2 and "--target must be at least 1.0 and at most 10" in err
    assert time.monotonic() - started < 10
    assert target_problem(10.0) is None and target_problem(1.0) is None


def test_inflation_refuses_more_arrivals_than_it_can_hold() -> None:
    pods = [PodSpec("tiny", 1, 1, 1, 1)]  # 1 milli of GPU per pod
    with pytest.raises(ValueError, match="target must be positive, finite"):
        inflate(pods, 1000, 0, float("nan"))
    check_inflatable(pods, 256_000, 1.3)  # a 256-card node: 332,800 pods of 1 milli is fine ...
    started = time.monotonic()
    with pytest.raises(ValueError, match=f"takes about 2,600,000 pods, more than {MAX_ARRIVALS:,}"):
        inflate(pods, 2_000_000, 0, 1.3)  # ... 2.6 million is not, and is refused before it is built
    assert time.monotonic() - started < 1


def test_a_pod_larger_than_the_target_is_refused_before_the_runs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A 4-card pod on a 2-card cluster: deflation would remove every GPU pod and leave no curve."""
    small = NODE_HEADER + "n0,64000,262144,2,T4\n"
    nodes, pods = files(tmp_path, nodes=small, pods=POD_HEADER + "big,4000,8192,4,1000,\nweb,1000,1024,0,0,\n")
    code, _, err = evaluate(capsys, tmp_path, "--nodes", nodes, "--pods", pods)
    assert code == 2
    assert "pod 'big' alone asks for 4 GPUs, more than 1.3 × the cluster's GPU capacity (2 GPUs)" in err
    with pytest.raises(ValueError, match="pod 'b' alone asks for 3 GPUs"):
        check_inflatable([PodSpec("a", 1, 1, 1, 1000), PodSpec("b", 1, 1, 3, 1000)], 2000, 1.3)
    check_inflatable([PodSpec("a", 1, 1, 2, 1000)], 2000, 1.3)  # 2 of 2.6 cards fits


def test_a_run_with_an_empty_curve_does_not_break_the_summary() -> None:
    from rlsched.policy.evaluate import Evaluation
    from rlsched.policy.simulator import RunResult

    empty = RunResult("fgd", 1, {}, 0, 0, 0, 0, 2000, 0.0, 0.1)
    evaluation = Evaluation("n", "p", 1.3, runs=[empty])
    [summary] = evaluation.summaries()
    assert summary.unallocated_130 == [100.0]


def test_arrivals_that_stop_short_of_100_are_marked(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # 18 cards; a 12-card pod: the first clone of it would pass 130 %, so arrivals stop near 70 %.
    nodes, pods = files(
        tmp_path,
        NODE_HEADER + "n0,128000,1048576,16,A100\nn1,64000,262144,2,P100\n",
        POD_HEADER + "p0,1000,1000,12,1000,\np1,1000,1000,1,300,\n",
    )
    code, out, _ = evaluate(capsys, tmp_path, "--nodes", nodes, "--pods", pods, "--seeds", "1-3")
    assert code == 0
    row = next(line for line in out.splitlines() if line.startswith("fgd "))
    assert "] *" in row
    assert "*fgd: arrivals stopped at" in out and "in 3 of 3 seed(s), never reaching 100 %" in out
    report = json.loads((tmp_path / "o" / "evaluation.json").read_text())
    short = report["summary"][0]["arrivals_short_of_100"]
    assert set(short) == {"1", "2", "3"} and all(pct < 100 for pct in short.values())
    assert [r["arrived_pct_max"] for r in report["runs"]] == [short[str(r["seed"])] for r in report["runs"]]


def test_a_normal_run_is_not_marked(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # Seed 7's curve has points at 100 % and 130 % (seed 1's jumps from 95 % to 105 %: marked).
    nodes, pods = files(tmp_path)
    code, out, err = evaluate(capsys, tmp_path, "--nodes", nodes, "--pods", pods, "--seeds", "7")
    assert code == 0 and " *" not in out and "stopped" not in out and "warning" not in err
    report = json.loads((tmp_path / "o" / "evaluation.json").read_text())
    assert {"100", "130"} <= set(report["runs"][0]["curve"])
    assert report["summary"][0]["arrivals_short_of_100"] == {} and report["runs"][0]["arrived_pct_max"] >= 100
    assert report["summary"][0]["not_read_at_100"] == {} == report["summary"][0]["not_read_at_130"]


def test_seeds_parse_in_linear_time_and_are_bounded() -> None:
    started = time.monotonic()
    assert len(parse_seeds("1-50000,25000-75000")) == 75000
    assert time.monotonic() - started < 1
    assert parse_seeds("3,1,3,2-3") == [3, 1, 2]
    with pytest.raises(ValueError, match=f"more than {MAX_SEEDS:,} seeds"):
        parse_seeds("0-100000")
    with pytest.raises(ValueError, match=f"more than {MAX_SEEDS:,} seeds"):
        parse_seeds("1-60000,100000-160000")
    with pytest.raises(ValueError, match="bad seed list"):
        parse_seeds("1-" + "9" * 30)
    assert parse_seeds("00000000000000000042,0-0,007") == [42, 0, 7]  # zeros in front are no digits


@pytest.mark.parametrize(
    "pod, reason",
    [
        (
            "p9,4000,8192,1,1000,v100m32",
            "gpu_spec 'v100m32' names no model the nodes have (T4, V100M32; names are case-sensitive)",
        ),
        ("p9,4000,8192,9,1000,", "num_gpu 9 is above every GPU node's (8 at most)"),
        ("p9,999999999,8192,1,1000,", "cpu_milli 999999999 is above every GPU node's (64000 at most)"),
        ("p9,999999999,8192,0,0,", "cpu_milli 999999999 is above every node's (64000 at most)"),
        ("p9,4000,8192,4,1000,T4", "num_gpu 4 is above every 'T4' node's (2 at most)"),
    ],
)
def test_pods_that_fit_no_empty_node_are_counted_on_stderr(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, pod: str, reason: str
) -> None:
    nodes, pods = files(tmp_path, pods=PODS + pod + "\n")
    code, out, err = evaluate(capsys, tmp_path, "--nodes", nodes, "--pods", pods)
    assert code == 0
    assert err == (
        f"rlsched evaluate: warning: 1 of 4 pods fit no node even in the empty cluster (first: 'p9', {reason}); "
        "each arrival of one, clones included, counts as a failed pod\n"
    )


def test_unplaceable_note_is_none_when_every_pod_fits() -> None:
    nodes = [NodeSpec("n", 64000, 262144, 8, "V100M32")]
    assert unplaceable_note(nodes, [PodSpec("p", 1000, 1024, 8, 1000, ("V100M32",)), PodSpec("c", 0, 0)]) is None
    assert "no node has one" in str(unplaceable_note([NodeSpec("c", 1000, 1024)], [PodSpec("g", 1, 1, 1, 1000)]))


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--json", "{dir}"], "--json {dir}: is a folder; give a file path"),
        (["--out", "{nodes}"], "--out {nodes}: is a file, not a folder"),
        (["--json", "{nodes}/x.json"], "{nodes} is a file, not a folder"),
        (["--mode", "events", "--json", "{dir}"], "--json {dir}: is a folder"),
        (["--mode", "dynamic", "--out", "{nodes}"], "{nodes} is a file, not a folder"),
        (["--mode", "dynamic", "--window", "nan"], "--window must be a finite number, got nan"),
        (["--mode", "dynamic", "--window", "1e12"], "--window must be in (0, 604800] seconds"),
        (["--mode", "dynamic", "--scrape-interval", "inf"], "--scrape-interval must be a finite number"),
        (["--mode", "dynamic", "--beta", "nan"], "--beta must be a finite number"),
        (["--nodes", "{dir}"], "--nodes: not a file: {dir}"),
    ],
)
def test_bad_outputs_and_settings_are_refused_before_the_runs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: list[str], message: str
) -> None:
    nodes, _ = files(tmp_path)
    pods = tmp_path / "timed.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "p0,4000,8192,1,1000,,LS,Running,0,600,0\np1,2000,4096,1,500,,BE,Running,10,900,10\n"
    )
    folder = tmp_path / "adir"
    folder.mkdir()
    fill = {"dir": str(folder), "nodes": nodes}
    argv = [flag.format(**fill) for flag in flags]
    base = [] if "--nodes" in flags else ["--nodes", nodes]
    code, out, err = evaluate(capsys, tmp_path, *base, "--pods", str(pods), *argv)
    assert code == 2 and message.format(**fill) in err and out == ""


def test_a_write_that_fails_after_the_runs_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rlsched.policy.evaluate as evaluate_module

    def full_disk(*_args: object, **_kwargs: object) -> None:
        raise OSError(28, "No space left on device", str(tmp_path / "o" / "evaluation.json"))

    monkeypatch.setattr(evaluate_module, "write_outputs", full_disk)
    nodes, pods = files(tmp_path)
    code, _, err = evaluate(capsys, tmp_path, "--nodes", nodes, "--pods", pods)
    assert code == 2 and "cannot write the outputs" in err and "No space left on device" in err


@pytest.mark.parametrize("jobs", ["100000", "257", "-1"])
def test_jobs_beyond_the_maximum_are_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path, jobs: str) -> None:
    nodes, pods = files(tmp_path)
    code, _, err = evaluate(capsys, tmp_path, "--nodes", nodes, "--pods", pods, f"--jobs={jobs}")
    assert code == 2 and f"--jobs must be 0 (one per core) to 256, got {jobs}" in err


def test_no_more_processes_than_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One policy on one seed is one run: --jobs 12 starts no process pool for it."""
    from rlsched.policy import evaluate as evaluate_module

    def no_pool(*_: object, **__: object) -> None:
        raise AssertionError("a process pool was started for a single run")

    monkeypatch.setattr(evaluate_module, "ProcessPoolExecutor", no_pool)
    nodes, pods = files(tmp_path)
    result = evaluate_module.evaluate(nodes, pods, ["fgd"], [1], jobs=12, progress=False)
    assert len(result.runs) == 1
