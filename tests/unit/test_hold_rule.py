"""benchmarks/hold_rule.py: which pods the probe holds, how rules are read, and the per-seed comparison."""

from __future__ import annotations

import numpy as np
import pytest
from benchmark_scripts import load_benchmark

from rlsched.policy.cluster import ClusterState, NodeSpec, PodSpec
from rlsched.policy.dynamic.objective import DynamicResult, ObjectiveWeights
from rlsched.policy.scorers import make_scorer
from rlsched.policy.typical import typical_pods

hr = load_benchmark("hold_rule")
TYPICAL = typical_pods([PodSpec("t", 1000, 1024, 1, 1000)])
STATE = ClusterState([NodeSpec("a", 32000, 65536, 8, "T4"), NodeSpec("b", 32000, 65536, 8, "T4")])
BOTH = np.array([0, 1])


@pytest.mark.parametrize(
    "pod, held",
    [
        (PodSpec("two", 1000, 1024, 2, 1000), True),  # 2 × 1000 milli: at the threshold
        (PodSpec("eight", 1000, 1024, 8, 1000), True),
        (PodSpec("one", 1000, 1024, 1, 1000), False),
        (PodSpec("share", 1000, 1024, 1, 500), False),
        (PodSpec("cpu", 1000, 1024), False),
    ],
)
def test_pods_asking_for_at_least_the_threshold_are_held(pod: PodSpec, held: bool) -> None:
    rule = hr.HoldLargePods(make_scorer("fgd", TYPICAL), 2000, 60.0)
    verdict = rule.verdict(STATE, STATE.request(pod), BOTH, None)
    assert (verdict is not None) == held
    if held:
        assert verdict[0] == "delay" and verdict[2] == 60.0 and "smaller pods first" in verdict[1]
    assert rule.verdict(STATE, STATE.request(pod), np.array([], dtype=np.int64), None) is None  # nothing fits


def test_placement_is_the_base_policys() -> None:
    base = make_scorer("fgd", TYPICAL)
    req = STATE.request(PodSpec("two", 1000, 1024, 2, 1000))
    held, plain = hr.HoldLargePods(base, 2000, 60.0).score(STATE, req, BOTH), base.score(STATE, req, BOTH)
    assert np.array_equal(held.values, plain.values)


def test_rules_are_read_and_checked() -> None:
    assert hr.parse_rule("none") is None
    assert hr.parse_rule("2000/30") == (2000.0, 30.0)
    assert hr.parse_rule("4000") == (4000.0, 60.0)
    for bad in ("-1/60", "2000/0", "x/60"):
        with pytest.raises(ValueError):
            hr.parse_rule(bad)


def test_compare_pairs_each_rule_with_none_on_the_same_seed() -> None:
    """Objectives (higher is better) made to differ only in the mean wait: with the default weights the
    latency term is β·wait_mean/300 s, so 30 s less wait is +0.1·β on the objective."""
    weights = ObjectiveWeights()

    def run(seed: int, wait: float) -> DynamicResult:
        return DynamicResult("fgd", seed, 1.0, 1000, 1, 1.0, wait_mean_s=wait)

    results = [("none", 1, run(1, 100.0)), ("none", 2, run(2, 100.0)), ("none", 3, run(3, 100.0))]
    results += [("2000/60", 1, run(1, 70.0)), ("2000/60", 2, run(2, 70.0)), ("2000/60", 3, run(3, 130.0))]
    rows = {r["rule"]: r for r in hr.compare(results, weights)}
    assert rows["none"]["vsNone"] is None
    vs = rows["2000/60"]["vsNone"]
    step = run(1, 70.0).objective(weights) - run(1, 100.0).objective(weights)
    assert step > 0
    assert vs["better"] == 2 and vs["worse"] == 1 and vs["medianDifference"] == pytest.approx(round(step, 4))
    assert rows["2000/60"]["wait_mean_s"] == 70.0 and rows["2000/60"]["seeds"] == [1, 2, 3]


def test_a_head_rule_plays_the_model_files_delay_head(tmp_path) -> None:
    from test_delay_head import large_pods_head, with_head
    from test_learned import write_model

    headed = with_head(tmp_path, large_pods_head())
    assert hr.parse_rule(f"head:{headed}") == str(headed)
    assert hr.learned_head(str(headed)).weights.tolist() == large_pods_head().weights.tolist()
    with pytest.raises(ValueError, match="no such model file"):
        hr.parse_rule(f"head:{tmp_path / 'nope.npz'}")
    with pytest.raises(ValueError, match="no delay head"):
        hr.learned_head(str(write_model(tmp_path / "plain.npz")))
