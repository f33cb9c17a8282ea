"""rlsched.policy.evaluate: how many processes a run uses by default."""

from __future__ import annotations

from pathlib import Path

from rlsched.policy.evaluate import default_jobs


def test_default_jobs_is_the_cores_within_the_cgroup_quota(tmp_path: Path) -> None:
    cores = default_jobs(tmp_path / "none")  # no quota file: the cores this process may run on
    assert cores >= 1
    quota = tmp_path / "cpu.max"
    quota.write_text("max 100000\n")
    assert default_jobs(quota) == cores
    quota.write_text("150000 100000\n")  # 1.5 CPUs: two processes
    assert default_jobs(quota) == min(cores, 2)
    quota.write_text("1000 100000\n")  # a hundredth of a CPU: still one
    assert default_jobs(quota) == 1
    quota.write_text("garbage\n")
    assert default_jobs(quota) == cores
