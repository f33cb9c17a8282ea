"""Typical pods (FGD protocol step 2): group, keep the largest groups up to the coverage, renormalize."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlsched.policy import PodSpec, TypicalPods, load_pods, typical_pods


def pods_of(groups: list[tuple[tuple, int]]) -> list[PodSpec]:
    """``[((cpu, num_gpu, gpu_milli, models), count), ...]`` → pods."""
    out = []
    for (cpu, num, milli, models), n in groups:
        out += [PodSpec(f"p{len(out) + i}", cpu, 1, num, milli, models) for i in range(n)]
    return out


def test_keeps_largest_groups_until_coverage() -> None:
    # Counts 6, 3, 1 of 10 pods; coverage 0.9 → keep 6 + 3 = 9 ≥ 9, drop the last group.
    pods = pods_of([((1000, 1, 500, ()), 3), ((2000, 0, 0, ()), 6), ((4000, 2, 1000, ("T4",)), 1)])
    typical = typical_pods(pods, coverage=0.9)
    assert len(typical) == 2
    assert typical.cpu_milli.tolist() == [2000, 1000]  # largest first
    assert typical.num_gpu.tolist() == [0, 1]
    assert typical.gpu_milli.tolist() == [0, 500]
    assert typical.gpu_models == ((), ())
    np.testing.assert_allclose(typical.weight, [6 / 9, 3 / 9])  # renormalized over the kept pods


def test_groups_by_request_not_memory_or_name() -> None:
    pods = [PodSpec("a", 1000, 1, 1, 500), PodSpec("b", 1000, 99999, 1, 500), PodSpec("c", 1000, 1, 1, 500, ("T4",))]
    typical = typical_pods(pods, coverage=1.0)
    assert len(typical) == 2
    assert typical.gpu_models == ((), ("T4",))
    np.testing.assert_allclose(typical.weight, [2 / 3, 1 / 3])


def test_full_coverage_keeps_all_and_weights_sum_to_one() -> None:
    rng = np.random.default_rng(0)
    pods = [PodSpec(f"p{i}", int(rng.integers(1, 5)) * 1000, 1, 1, int(rng.integers(1, 10)) * 100) for i in range(200)]
    typical = typical_pods(pods, coverage=1.0)
    assert len(typical) == len({(p.cpu_milli, p.gpu_milli) for p in pods})
    assert typical.weight.sum() == pytest.approx(1.0)
    assert (np.diff(typical.weight) <= 1e-12).all()  # sorted by size


def test_order_of_input_does_not_matter() -> None:
    # Two groups of equal size: the tie is broken by the key, not by which came first.
    a = [PodSpec("x", 1000, 1, 1, 300)] * 2 + [PodSpec("y", 500, 1, 1, 300)] * 2
    first, second = typical_pods(a, 1.0), typical_pods(a[::-1], 1.0)
    assert first.cpu_milli.tolist() == second.cpu_milli.tolist() == [500, 1000]


def test_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="empty workload"):
        typical_pods([])
    for bad in (0, -0.1, 1.5):
        with pytest.raises(ValueError, match="coverage"):
            typical_pods([PodSpec("a", 1, 1)], coverage=bad)


def test_json_roundtrip_and_errors() -> None:
    typical = typical_pods(pods_of([((1000, 1, 500, ("T4", "V100")), 3), ((2000, 0, 0, ()), 1)]), 1.0)
    back = TypicalPods.from_json(typical.to_json())
    for name in ("cpu_milli", "gpu_milli", "num_gpu", "weight"):
        np.testing.assert_array_equal(getattr(back, name), getattr(typical, name))
    assert back.gpu_models == typical.gpu_models
    with pytest.raises(ValueError, match="empty"):
        TypicalPods.from_json([])
    with pytest.raises(ValueError, match=r"typical pods\[1\]: expected cpuMilli"):
        TypicalPods.from_json([{"cpuMilli": 1, "gpuMilli": 0, "numGpu": 0, "weight": 1}, {"cpuMilli": 1}])
    for weight in (0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=r"typical pods\[0\]: weight must be a positive finite number"):
            TypicalPods.from_json([{"cpuMilli": 1, "gpuMilli": 0, "numGpu": 0, "weight": weight}])
    for amount in (-1, 2**53 + 1):
        with pytest.raises(ValueError, match=r"typical pods\[0\]: amounts must be from 0 to"):
            TypicalPods.from_json([{"cpuMilli": amount, "gpuMilli": 0, "numGpu": 0, "weight": 1}])
    with pytest.raises(ValueError, match="the weights' sum is not a finite number"):  # every weight read as 0
        TypicalPods.from_json([{"cpuMilli": 1, "gpuMilli": 0, "numGpu": 0, "weight": 1e308}] * 2)
    # Weights are renormalized on the way in.
    np.testing.assert_allclose(
        TypicalPods.from_json(
            [
                {"cpuMilli": 1, "gpuMilli": 0, "numGpu": 0, "weight": 3},
                {"cpuMilli": 2, "gpuMilli": 0, "numGpu": 0, "weight": 1},
            ]
        ).weight,
        [0.75, 0.25],
    )


def test_access_matrix() -> None:
    typical = typical_pods(pods_of([((1, 1, 500, ()), 4), ((1, 1, 500, ("V100",)), 3), ((1, 0, 0, ("V100",)), 2)]), 1.0)
    # Columns: T4, V100, CPU-only nodes (model id -1).
    assert typical.access(("T4", "V100")).tolist() == [
        [True, True, True],  # unconstrained GPU pod (a CPU-only node has no free GPU milli anyway)
        [False, True, False],  # V100 only
        [True, True, True],  # a model list on a CPU-only pod constrains nothing
    ]


def test_default_trace_keeps_35_specs(openb_dir: Path) -> None:
    typical = typical_pods(load_pods(openb_dir / "openb_pod_list_default.csv"))
    assert len(typical) == 35  # the openb README: "On the default trace this keeps 35 specs"
    assert typical.weight.sum() == pytest.approx(1.0)
