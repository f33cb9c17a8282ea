"""The usage model: its fits reproduce the published numbers, its draws are seeded and bounded."""

from __future__ import annotations

import numpy as np
import pytest

from rlsched.policy.cluster import PodSpec
from rlsched.policy.dynamic.usage import (
    PodUsage,
    UsageModel,
    UsageSettings,
    gpu_utilization_cdf,
    lognormal_cdf,
)

# The published points each default must reproduce (docs/usage-model.md has the quotes).
# GPU, affinode analysis of pai_sensor_table.gpu_wrk_util: (utilization, fraction of instances at or below).
GPU_POINTS = [(0.0, 0.345), (0.015, 0.50), (0.10, 0.754), (0.50, 0.95)]
CPU_BELOW_REQUEST = 0.8446  # alibaba/clusterdata analysis.ipynb: "cpu: plan > usage: 84.46%"
MEM_BELOW_REQUEST = 0.9588  # same cell: "mem: plan > usage: 95.88%"
CPU_MEDIAN = 88 / 600  # Figure 6(a): usage median 88 % of a core over request median 600 %
FIT_TOLERANCE = 0.005  # fitted CDF within 0.5 percentage points of each quoted point
SAMPLE_TOLERANCE = 0.01  # empirical CDF of 100,000 draws within 1 point (binomial sd <= 0.16 pp)


def _pods(n_gpu: int, n_share: int, n_cpu: int) -> list[PodSpec]:
    pods = [PodSpec(f"g{i}", 8000, 16384, num_gpu=2, gpu_milli=1000) for i in range(n_gpu)]
    pods += [PodSpec(f"s{i}", 4000, 8192, num_gpu=1, gpu_milli=300) for i in range(n_share)]
    pods += [PodSpec(f"c{i}", 2000, 4096) for i in range(n_cpu)]
    return pods


@pytest.mark.parametrize(("x", "quoted"), GPU_POINTS)
def test_gpu_fit_reproduces_the_quoted_points(x: float, quoted: float) -> None:
    assert gpu_utilization_cdf(x, UsageSettings()) == pytest.approx(quoted, abs=FIT_TOLERANCE)


def test_cpu_and_memory_fits_reproduce_the_quoted_points() -> None:
    s = UsageSettings()
    assert s.cpu_ratio_median == pytest.approx(CPU_MEDIAN, rel=0.01)
    assert lognormal_cdf(1.0, s.cpu_ratio_median, s.cpu_ratio_sigma) == pytest.approx(
        CPU_BELOW_REQUEST, abs=FIT_TOLERANCE
    )
    assert lognormal_cdf(1.0, s.mem_ratio_median, s.mem_ratio_sigma) == pytest.approx(
        MEM_BELOW_REQUEST, abs=FIT_TOLERANCE
    )


def test_draws_reproduce_the_quoted_points() -> None:
    n = 100_000
    pods = _pods(n, 0, 0)
    usage = UsageModel().draw(pods, np.random.default_rng(7), qos=["LS"] * n)
    for x, quoted in GPU_POINTS:
        assert np.mean(usage.gpu_mean <= x) == pytest.approx(quoted, abs=SAMPLE_TOLERANCE), x
    assert np.mean(usage.cpu_mean < 1.0) == pytest.approx(CPU_BELOW_REQUEST, abs=SAMPLE_TOLERANCE)
    assert np.mean(usage.mem_mean < 1.0) == pytest.approx(MEM_BELOW_REQUEST, abs=SAMPLE_TOLERANCE)
    assert np.median(usage.cpu_mean) == pytest.approx(CPU_MEDIAN, rel=0.03)


def _same(a: PodUsage, b: PodUsage) -> bool:
    fields = ("cpu_mean", "mem_mean", "gpu_mean", "cpu_std", "mem_std", "gpu_std", "cpu_max", "mem_max")
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in fields)


def test_seeded_reproducibility() -> None:
    model = UsageModel()
    pods = _pods(50, 50, 50)
    a = model.draw(pods, np.random.default_rng(3))
    b = model.draw(pods, np.random.default_rng(3))
    c = model.draw(pods, np.random.default_rng(4))
    assert _same(a, b)
    assert not _same(a, c)
    idx = np.arange(0, 150, 7)
    first = model.instant(a, idx, np.random.default_rng(11))
    second = model.instant(a, idx, np.random.default_rng(11))
    for x, y in zip(first, second, strict=True):
        assert np.array_equal(x, y)


def test_stream_does_not_depend_on_the_pod_mix() -> None:
    # The same seed and pod count give the same CPU and memory draws whatever the pods ask for.
    a = UsageModel().draw(_pods(30, 0, 0), np.random.default_rng(5))
    b = UsageModel().draw(_pods(0, 0, 30), np.random.default_rng(5))
    assert np.array_equal(a.cpu_mean, b.cpu_mean)
    assert np.array_equal(a.mem_mean, b.mem_mean)


def test_cpu_only_pods_use_no_gpu() -> None:
    model = UsageModel()
    pods = _pods(100, 100, 100)
    usage = model.draw(pods, np.random.default_rng(0))
    cpu_only = np.arange(200, 300)
    assert np.all(usage.gpu_mean[cpu_only] == 0.0)
    assert np.all(usage.gpu_std[cpu_only] == 0.0)
    _, _, gpu = model.instant(usage, cpu_only, np.random.default_rng(1))
    assert np.all(gpu == 0.0)
    assert np.any(usage.gpu_mean[:200] > 0.0)


def test_bounds_are_respected() -> None:
    model = UsageModel(UsageSettings(cpu_cv=2.0, mem_cv=2.0, gpu_cv=2.0))  # wide, to reach the bounds
    n = 20_000
    pods = _pods(n // 2, 0, n // 2)
    qos = ["Guaranteed" if i % 4 == 0 else "BE" for i in range(n)]
    usage = model.draw(pods, np.random.default_rng(9), qos=qos)
    s = model.settings
    guaranteed = np.array([q == "Guaranteed" for q in qos])
    assert np.all(usage.cpu_max[guaranteed] == 1.0)
    assert np.all(usage.mem_max[guaranteed] == 1.0)
    assert np.all(usage.cpu_max[~guaranteed] == pytest.approx(s.cpu_cap))
    assert np.all(usage.mem_max[~guaranteed] == pytest.approx(s.mem_cap))
    assert np.all((usage.gpu_mean >= 0.0) & (usage.gpu_mean <= 1.0))
    assert np.all((usage.cpu_mean >= 0.0) & (usage.cpu_mean <= usage.cpu_max))
    assert np.all((usage.mem_mean >= 0.0) & (usage.mem_mean <= usage.mem_max))
    rng = np.random.default_rng(10)
    idx = np.arange(n)
    for _ in range(5):
        cpu, mem, gpu = model.instant(usage, idx, rng)
        assert np.all((cpu >= 0.0) & (cpu <= usage.cpu_max))
        assert np.all((mem >= 0.0) & (mem <= usage.mem_max))
        assert np.all((gpu >= 0.0) & (gpu <= 1.0))
        assert np.all(cpu[guaranteed] <= 1.0)
    # Bursting above the request happens for the non-Guaranteed pods (the trace's 15.5 % of tasks).
    assert np.any(cpu[~guaranteed] > 1.0)


def test_caps_are_the_stated_quantile() -> None:
    s = UsageSettings()
    assert lognormal_cdf(s.cpu_cap, s.cpu_ratio_median, s.cpu_ratio_sigma) == pytest.approx(s.cap_quantile)
    assert lognormal_cdf(s.mem_cap, s.mem_ratio_median, s.mem_ratio_sigma) == pytest.approx(s.cap_quantile)


def test_scrapes_average_to_the_mean() -> None:
    model = UsageModel()
    pods = _pods(1, 0, 0)
    usage = PodUsage(
        cpu_mean=np.array([0.4]),
        mem_mean=np.array([0.5]),
        gpu_mean=np.array([0.2]),
        cpu_std=np.array([0.12]),
        mem_std=np.array([0.05]),
        gpu_std=np.array([0.06]),
        cpu_max=np.array([model.settings.cpu_cap]),
        mem_max=np.array([model.settings.mem_cap]),
    )
    assert len(usage) == len(pods)
    idx = np.zeros(200_000, dtype=np.intp)
    cpu, mem, gpu = model.instant(usage, idx, np.random.default_rng(2))
    assert cpu.mean() == pytest.approx(0.4, rel=0.01)
    assert cpu.std() == pytest.approx(0.12, rel=0.03)
    assert mem.mean() == pytest.approx(0.5, rel=0.01)
    assert gpu.mean() == pytest.approx(0.2, rel=0.01)


def test_qos_scale_and_qos_attribute() -> None:
    settings = UsageSettings(qos_scale={"BE": 0.5})
    pods = _pods(1000, 0, 0)
    ls = UsageModel(settings).draw(pods, np.random.default_rng(1), qos=["LS"] * 1000)
    be = UsageModel(settings).draw(pods, np.random.default_rng(1), qos=["BE"] * 1000)
    uncapped = ls.cpu_mean < ls.cpu_max
    assert np.allclose(be.cpu_mean[uncapped], 0.5 * ls.cpu_mean[uncapped])
    from_spec = [PodSpec(f"p{i}", 1000, 1024, qos="BE") for i in range(1000)]
    by_attribute = UsageModel(settings).draw(from_spec, np.random.default_rng(1))
    by_argument = UsageModel(settings).draw(from_spec, np.random.default_rng(1), qos=["BE"] * 1000)
    assert np.array_equal(by_attribute.cpu_mean, by_argument.cpu_mean)
    assert np.array_equal(by_attribute.cpu_mean, be.cpu_mean)
    with pytest.raises(ValueError, match="QoS classes"):
        UsageModel().draw(pods, np.random.default_rng(1), qos=["LS"])


@pytest.mark.parametrize(
    "bad",
    [
        {"gpu_idle_fraction": 1.0},
        {"cpu_ratio_sigma": 0.0},
        {"cap_quantile": 1.0},
        {"gpu_cv": -0.1},
        {"qos_scale": {"BE": -1.0}},
    ],
)
def test_settings_reject_nonsense(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        UsageSettings(**bad)  # type: ignore[arg-type]
