"""benchmarks/extender_cpu.py runs end to end on a small cluster (its figures are not judged here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_a_small_round_schedules_pods_and_reports_their_cpu(tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    done = subprocess.run(
        [sys.executable, "benchmarks/extender_cpu.py", "--nodes", "40", "--pods", "60", "--warm", "10"]
        + ["--rounds", "1", "--offered", "0.5", "--json", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    (r,) = result["rounds"]
    assert r["pods"] == 50 and 0 < r["scheduled"] <= 50 and r["cpuMsPerPod"] > 0
    assert "ms of extender CPU per pod" in done.stdout
