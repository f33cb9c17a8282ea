"""benchmarks/reproduce_fgd.py: the table's header names the command and the workers that made it; the
exit status says whether every published median was matched (evaluate() stubbed: no simulation)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from benchmark_scripts import load_benchmark


def stub_evaluate(median: float, calls: list[dict]) -> Any:
    def evaluate(nodes: Path, pods: Path, policies: list[str], seeds: list[int], **kw: Any) -> Any:
        calls.append(kw)
        row = {"unallocated_gpu_pct_at_100": {"median": median}}
        return SimpleNamespace(summaries=lambda: [SimpleNamespace(policy=p, to_json=lambda: row) for p in policies])

    return evaluate


@pytest.mark.parametrize(("median", "status"), [(4.77, 0), (6.0, 1)])  # FGD on default: published 4.77
def test_the_header_shows_the_arguments_and_jobs_used(
    tmp_path: Path, monkeypatch: Any, median: float, status: int
) -> None:
    bench = load_benchmark("reproduce_fgd")
    calls: list[dict] = []
    monkeypatch.setattr(bench, "evaluate", stub_evaluate(median, calls))
    out = tmp_path / "fgd.md"
    argv = ["--data", str(tmp_path), "--traces", "default", "--policy", "fgd", "--jobs", "3"]
    assert bench.main([*argv, "--out", str(out)]) == status
    assert [c["jobs"] for c in calls] == [3]
    header = out.read_text().splitlines()[3]
    assert '`python benchmarks/reproduce_fgd.py --data "$OPENB" --out ' in header
    assert "--traces default --policy fgd --jobs 3`" in header
    assert header.endswith("with 3 worker process(es).")
    assert ("**miss**" in out.read_text()) == bool(status)


def test_other_seeds_get_no_verdict(tmp_path: Path, monkeypatch: Any) -> None:
    """The published figures are medians over seeds 42-51: a median over two seeds that differs is no miss."""
    bench = load_benchmark("reproduce_fgd")
    monkeypatch.setattr(bench, "evaluate", stub_evaluate(6.0, []))
    out = tmp_path / "fgd.md"
    argv = ["--data", str(tmp_path), "--traces", "default", "--policy", "fgd", "--jobs", "1", "--seeds", "42-43"]
    assert bench.main([*argv, "--out", str(out)]) == 0
    text = out.read_text()
    assert "**miss**" not in text and "6.00 / 4.77 (+1.23 ref)" in text and "Misses: 0" in text


def test_the_exit_status_is_documented_in_the_help(capsys: Any) -> None:
    bench = load_benchmark("reproduce_fgd")
    with pytest.raises(SystemExit):
        bench.main(["--help"])
    assert "Exit status: 0 when every published median is matched" in capsys.readouterr().out
