"""The delay head: its inputs, its rule, the model file that carries it, serving, and the search."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from openb_files import write_openb
from ppo_fixtures import filled_state, small_typical
from test_dynamic_rebalancing import NODES, PODS
from test_learned import rewrite, write_model

from rlsched.policy import feasible_nodes
from rlsched.policy.cluster import ClusterState, NodeSpec, PodSpec
from rlsched.policy.delay_head import DELAY_INPUTS, DelayHead, delay_inputs
from rlsched.policy.dynamic.delay_search import (
    DelaySearchSettings,
    WithDelayHead,
    search,
    shaped_fitness,
    validation_gain,
)
from rlsched.policy.export import ModelFileError, read_model, save_model
from rlsched.policy.features import FEATURES, FeatureEncoder
from rlsched.policy.learned import load_learned_scorer
from rlsched.policy.scorers import make_scorer

N = len(DELAY_INPUTS)
BIG = PodSpec("eight", 4000, 8192, 8, 1000)
SMALL = PodSpec("share", 1000, 1024, 1, 500)


def large_pods_head(hold_s: float = 60.0) -> DelayHead:
    """Holds a pod when it asks for more than four cards: logit = 8·(pod_gpu_total − 0.5)."""
    weights = np.zeros(N)
    weights[DELAY_INPUTS.index("pod_gpu_total")] = 8.0
    return DelayHead(np.zeros(N), np.ones(N), weights, -4.0, hold_s)


@pytest.mark.parametrize(
    "pod", [PodSpec("one", 1000, 1024, 1, 1000), SMALL, PodSpec("cpu", 2000, 4096), PodSpec("two", 1000, 1024, 2, 1000)]
)
def test_the_inputs_are_the_feature_encoders_columns(pod: PodSpec) -> None:
    state = filled_state(seed=3)
    req = state.request(pod)
    nodes = feasible_nodes(state, req)
    assert len(nodes) > 0
    row = FeatureEncoder(small_typical()).encode(state, req, nodes).features[0]
    mine = delay_inputs(state, req)
    for k, name in enumerate(DELAY_INPUTS):
        assert mine[k] == pytest.approx(float(row[FEATURES.index(name)]), rel=1e-6, abs=1e-7), name


def test_the_rule_is_a_sign_of_a_linear_logit() -> None:
    # An empty node of 8 cards: pod_gpu_total is 8000/8000 = 1 for BIG → 8·1 − 4 = +4, held;
    # 500/8000 for SMALL → 8·0.0625 − 4 = −3.5, placed.
    state = ClusterState([NodeSpec("a", 64000, 262144, 8, "V100M32")])
    head = large_pods_head()
    assert head.logit(state, state.request(BIG)) == pytest.approx(4.0)
    assert head.logit(state, state.request(SMALL)) == pytest.approx(-3.5)
    assert head.holds(state, state.request(BIG)) and not head.holds(state, state.request(SMALL))
    never = DelayHead.never(np.zeros(N), np.ones(N))
    assert not never.holds(state, state.request(BIG))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"center": np.zeros(N + 1)}, "center"),
        ({"scale": np.zeros(N)}, "positive"),
        ({"weights": np.full(N, np.nan)}, "weights"),
        ({"hold_s": 0.0}, "a hold of more than 0 and at most 3600 s"),
        ({"hold_s": float("inf")}, "a hold of more than 0 and at most 3600 s"),
        ({"hold_s": float("nan")}, "a hold of more than 0 and at most 3600 s"),
        ({"hold_s": 1e12}, "a hold of more than 0 and at most 3600 s"),
    ],
)
def test_a_bad_head_is_refused(change: dict[str, object], message: str) -> None:
    fields = {"center": np.zeros(N), "scale": np.ones(N), "weights": np.zeros(N), "bias": -1.0, "hold_s": 60.0}
    with pytest.raises(ValueError, match=message):
        DelayHead(**{**fields, **change})  # type: ignore[arg-type]


def with_head(tmp_path: Path, head: DelayHead) -> Path:
    base = write_model(tmp_path / "base.npz")
    params, manifest, _ = read_model(base)
    path = tmp_path / "headed.npz"
    save_model(path, {**params, **head.arrays()}, {**manifest, "delayHead": head.manifest({"test": True})})
    return path


def test_a_model_with_a_head_serves_its_delay_verdict(tmp_path: Path) -> None:
    path = with_head(tmp_path, large_pods_head(hold_s=45.0))
    scorer = load_learned_scorer(path)
    assert scorer.delay_head is not None and scorer.delay_head.hold_s == 45.0
    state = ClusterState([NodeSpec("a", 64000, 262144, 8, "V100M32"), NodeSpec("b", 64000, 262144, 8, "V100M32")])
    both = np.array([0, 1])
    for pod, held in ((BIG, True), (SMALL, False)):
        req = state.request(pod)
        verdict = scorer.verdict(state, req, both, scorer.score(state, req, both))
        assert (verdict is not None) == held
        if verdict is not None:
            assert verdict[0] == "delay" and verdict[2] == 45.0 and "delay head" in verdict[1]
    assert scorer.verdict(state, state.request(BIG), np.array([], dtype=np.int64), None) is None  # no candidate
    one = np.array([1])
    assert scorer.verdict(state, state.request(BIG), one, None) is not None  # one node fits: unscored, still held
    state.place(state.request(PodSpec("four", 1000, 1024, 4, 1000)), 1, (0, 1, 2, 3))
    assert scorer.verdict(state, state.request(BIG), one, None) is None  # nothing fits: it waits, not delayed
    ablation = load_learned_scorer(path, prior_only=True)
    assert ablation.delay_head is None
    assert ablation.verdict(state, state.request(BIG), both, ablation.score(state, state.request(BIG), both)) is None
    assert load_learned_scorer(tmp_path / "base.npz").delay_head is None


def test_a_head_in_a_file_must_be_whole_and_match_this_version(tmp_path: Path) -> None:
    path = with_head(tmp_path, large_pods_head())

    def no_entry(arrays: dict[str, np.ndarray], manifest: dict[str, object]) -> None:
        del manifest["delayHead"]

    def other_inputs(arrays: dict[str, np.ndarray], manifest: dict[str, object]) -> None:
        manifest["delayHead"] = {**manifest["delayHead"], "inputs": ["pod_cpu"]}  # type: ignore[dict-item]

    def no_bias(arrays: dict[str, np.ndarray], manifest: dict[str, object]) -> None:
        del arrays["delay_bias"]

    def bad_scale(arrays: dict[str, np.ndarray], manifest: dict[str, object]) -> None:
        arrays["delay_scale"] = -np.ones(N, dtype=np.float32)

    for change, message in (
        (no_entry, "without a delayHead entry"),
        (other_inputs, "differ from this rlsched"),
        (no_bias, "missing"),
        (bad_scale, "positive"),
    ):
        bad = rewrite(path, tmp_path / f"{change.__name__}.npz", change)
        with pytest.raises(ModelFileError, match=message):
            read_model(bad)


def test_with_delay_head_keeps_the_placement_and_records_inputs() -> None:
    state = ClusterState([NodeSpec("a", 64000, 262144, 8, "V100M32"), NodeSpec("b", 64000, 262144, 8, "V100M32")])
    rows: list[np.ndarray] = []
    base = make_scorer("fgd", small_typical())
    wrapped = WithDelayHead(base, large_pods_head(), rows)
    req = state.request(BIG)
    both = np.array([0, 1])
    assert wrapped.score(state, req, both).values.tolist() == base.score(state, req, both).values.tolist()
    assert wrapped.verdict(state, req, both, None) == ("delay", "the delay head holds it", 60.0)
    assert wrapped.verdict(state, state.request(SMALL), both, None) is None
    assert len(rows) == 2 and rows[0].tolist() == delay_inputs(state, req).tolist()


def test_the_search_writes_a_model_that_serves(tmp_path: Path) -> None:
    nodes, pods = write_openb(tmp_path, NODES, PODS)
    start = write_model(tmp_path / "start.npz")
    out = tmp_path / "delayed.npz"
    cfg = DelaySearchSettings(
        nodes=str(nodes),
        pods=str(pods),
        start_model=str(start),
        generations=2,
        population=3,
        elites=2,
        seeds_per_load=1,
        loads=(0.9, 1.2),
        val_seeds=(7,),
        eval_every=1,
        window_s=900.0,
        workers=1,
        out=str(out),
    )
    entry = search(cfg, log=lambda _line: None)
    params, manifest, _ = read_model(out)
    start_params, start_manifest, _ = read_model(start)
    for name, value in start_params.items():
        assert np.array_equal(params[name], value), f"the placement network is the start model's ({name})"
    assert manifest["version"] == start_manifest["version"] + "+delay"
    training = manifest["delayHead"]["training"]
    assert entry == manifest["delayHead"] and training["chosenAtGeneration"] in (0, 1, 2)
    assert json.loads(out.with_suffix(".json").read_text()) == manifest
    gains = [training["validationReward"][k] - v for k, v in training["neverValidationReward"].items()]
    assert training["beatNever"] == (min(gains) >= 0 and training["validationGain"] > 0)
    assert "/" not in training["settings"]["nodes"], "no folder of the machine it was trained on"
    head = load_learned_scorer(out).delay_head
    assert head is not None and (head.scale > 0).all()
    if not training["beatNever"]:
        assert head.bias == -1.0 and not head.weights.any()
    assert training["startHead"] is None
    history = json.loads((tmp_path / "delayed-history.json").read_text())
    assert [row["generation"] for row in history] == [1, 2] and all("val_reward" in row for row in history)

    # Continuing from a model that has a head: the search starts there, keeps its scales and provenance.
    seeded = with_head(tmp_path, large_pods_head())
    again = search(
        DelaySearchSettings(**{**cfg.__dict__, "start_model": str(seeded), "generations": 1}), lambda _: None
    )
    _, manifest2, _ = read_model(out)
    assert again == manifest2["delayHead"] and again["training"]["startHead"] == {"test": True}
    assert manifest2["version"].count("+delay") == 1
    continued = load_learned_scorer(out).delay_head
    assert continued is not None and continued.scale.tolist() == large_pods_head().scale.tolist()
    history = json.loads((tmp_path / "delayed-history.json").read_text())
    assert [row["generation"] for row in history] == [1] and all("val_reward" in row for row in history)


def test_fitness_is_ranked_per_load_and_seed() -> None:
    # Column 1 (full load) differs by points, column 2 (below it) by hundredths; the plain mean
    # would pick candidate 0, the per-column ranks weigh candidate 1's consistent edge below load.
    rewards = np.array([[-90.0, -64.60, -64.60], [-91.0, -64.50, -64.50], [-95.0, -64.70, -64.70]])
    fitness = shaped_fitness(rewards)
    assert fitness.tolist() == pytest.approx([(0.5 + 0.0 + 0.0) / 3, (0.0 + 0.5 + 0.5) / 3, -0.5])
    assert shaped_fitness(np.array([[1.0, 2.0], [1.0, 3.0]])).tolist() == [-0.25, 0.25]  # a tie shares its rank
    assert shaped_fitness(np.zeros((1, 3))).tolist() == [0.0]


def test_a_head_that_loses_at_any_load_is_not_chosen() -> None:
    never = {0.9: -64.5, 1.0: -95.0}
    assert validation_gain({0.9: -64.5, 1.0: -93.0}, never) == pytest.approx(1.0)
    assert validation_gain({0.9: -64.6, 1.0: -90.0}, never) is None
    assert validation_gain({0.9: -64.6, 1.0: -90.0}, never, guard=False) == pytest.approx(2.45)


def test_train_delay_refuses_bad_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rlsched.cli import main as rlsched_main

    nodes, pods = write_openb(tmp_path, NODES, PODS)
    start = write_model(tmp_path / "start.npz")
    common = ["train-delay", "--nodes", str(nodes), "--pods", str(pods), "--start-model", str(start)]
    assert rlsched_main([*common, "--fitness", "best"]) == 2 and "ranked or mean" in capsys.readouterr().err
    assert rlsched_main([*common, "--loads", "0"]) == 2 and "loads in (0, 10]" in capsys.readouterr().err
    assert rlsched_main([*common, "--elites", "20"]) == 2 and "elites" in capsys.readouterr().err
    code = rlsched_main(["train-delay", "--nodes", str(tmp_path / "none.csv"), "--pods", str(pods)])
    assert code == 2 and "no such file" in capsys.readouterr().err


def test_the_bundled_delay_model_is_the_dynamic_model_plus_a_head_that_waits_only_when_full() -> None:
    from rlsched.policy.learned import DEFAULT_MODEL

    folder = DEFAULT_MODEL.parent
    params, manifest, _ = read_model(folder / "ppo-openb-dynamic-delay.npz")
    base, _, _ = read_model(folder / "ppo-openb-dynamic.npz")
    for name, value in base.items():
        assert np.array_equal(params[name], value), f"same placement network as ppo-openb-dynamic ({name})"
    training = manifest["delayHead"]["training"]
    assert training["beatNever"] is True and training["startHead"] is not None
    assert all("/" not in str(v) for v in training["settings"].values()), "no folder of the machine it was trained on"
    head = DelayHead.from_model(params, manifest)
    assert head is not None
    # 89 of 100 eight-card nodes full (GPU 89 % allocated, CPU 44 % free: below full load, nothing held)
    # and 97 of 100 (97 %, 33 % free: full, an 8-card pod held); a CPU-only pod is never held.
    nodes = [NodeSpec(f"n{i}", 100_000, 1_000_000, 8, "V100M32") for i in range(100)]
    for alloc, cpu_free, held in ((0.886, 0.368, False), (0.970, 0.313, True)):
        state = ClusterState(nodes)
        for i in range(round(alloc * 100)):
            state.place(state.request(PodSpec("f", round((1 - cpu_free) * 100_000), 1024, 8, 1000)), i, tuple(range(8)))
        assert head.holds(state, state.request(BIG)) is held, (alloc, cpu_free)
        assert not head.holds(state, state.request(PodSpec("cpu", 2000, 4096)))
