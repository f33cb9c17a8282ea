"""The learned rebalancer: its weights file, ``learned:FILE`` in the living cluster, and the search."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from openb_files import write_openb
from test_dynamic_rebalancing import NODES, PODS, SETTINGS, TYPICAL

from rlsched.cli import main as rlsched_main
from rlsched.policy import make_scorer
from rlsched.policy.dynamic.rebalance_search import SearchSettings, search
from rlsched.policy.dynamic.rebalancing import RebalancerSettings, run_rebalanced
from rlsched.policy.rebalance import RebalanceSettings
from rlsched.policy.rebalance_weights import (
    FORMAT,
    MAX_FILE_BYTES,
    WEIGHTS,
    read_weights_file,
    settings_from_weights,
    weight_problems,
    weights_of,
    write_weights_file,
)


def test_every_weight_names_a_settings_field_and_defaults_agree() -> None:
    defaults = RebalanceSettings()
    for name, (field, default, low, high, _what) in WEIGHTS.items():
        assert getattr(defaults, field) == default, name
        assert low <= default <= high, name
    assert settings_from_weights(weights_of(defaults)) == defaults


def test_the_file_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "w.json"
    write_weights_file(path, {"hot": 2.0, "podGpu": -0.01}, {"seconds": 1})
    settings, body = read_weights_file(path)
    assert settings == RebalanceSettings(hot_weight=2.0, pod_gpu_weight=-0.01)
    assert body["format"] == FORMAT and body["training"] == {"seconds": 1}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{", "not JSON"),
        ("[]", "not a rlsched-rebalance-weights file"),
        (json.dumps({"format": FORMAT, "formatVersion": 9, "weights": {}}), "format version 9"),
        (json.dumps({"format": FORMAT, "formatVersion": 1, "weights": []}), "'weights' must be an object"),
        (json.dumps({"format": FORMAT, "formatVersion": 1, "weights": {"heat": 1}}), "unknown field"),
        (json.dumps({"format": FORMAT, "formatVersion": 1, "weights": {"hot": "1"}}), "weights.hot"),
        (
            json.dumps({"format": FORMAT, "formatVersion": 1, "weights": {"hot": 0.2, "latencySensitiveHot": -1}}),
            "negative",
        ),
    ],
)
def test_a_bad_file_says_what_is_wrong(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "w.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=fragment):
        read_weights_file(path)


def test_a_huge_or_missing_file_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_bytes(b" " * (MAX_FILE_BYTES + 1))
    with pytest.raises(ValueError, match="larger than"):
        read_weights_file(path)
    with pytest.raises(ValueError, match="missing.json"):
        read_weights_file(tmp_path / "missing.json")
    assert len(weight_problems({f"x{i}": 1 for i in range(100)})) == 10  # bounded, whatever the spec holds


def test_learned_with_the_heuristics_weights_is_heuristic_usage(tmp_path: Path) -> None:
    path = tmp_path / "hand.json"
    write_weights_file(path, weights_of(RebalanceSettings()), {})
    kw = {"min_age_s": 0.0, "max_moves_per_hour": 6}
    runs = [
        run_rebalanced(NODES, PODS, make_scorer("fgd", TYPICAL), 3, TYPICAL, name, SETTINGS, RebalancerSettings(**kw))
        for name in ("heuristic-usage", f"learned:{path}")
    ]
    (a, sa), (b, sb) = runs
    assert sa.evicted > 0 and sa == sb
    assert a.summary() | {"seconds": 0, "policy": ""} == b.summary() | {"seconds": 0, "policy": ""}


def test_other_weights_change_the_moves(tmp_path: Path) -> None:
    path = tmp_path / "no-gpu-moves.json"
    write_weights_file(path, {"podGpu": -100.0}, {})  # any GPU pod costs more than a move can gain
    kw = {"min_age_s": 0.0, "max_moves_per_hour": 6}
    scorer = make_scorer("fgd", TYPICAL)
    hand = run_rebalanced(NODES, PODS, scorer, 3, TYPICAL, "heuristic-usage", SETTINGS, RebalancerSettings(**kw))
    learned = run_rebalanced(NODES, PODS, scorer, 3, TYPICAL, f"learned:{path}", SETTINGS, RebalancerSettings(**kw))
    assert hand[1].evicted > 0 and learned[1].evicted < hand[1].evicted


def test_the_search_writes_a_file_that_evaluate_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = write_openb(tmp_path, NODES, PODS)
    out = tmp_path / "learned.json"
    cfg = SearchSettings(
        nodes=str(nodes),
        pods=str(pods),
        generations=2,
        population=3,
        elites=2,
        seeds_per_candidate=1,
        val_seeds=(7,),
        eval_every=1,
        window_s=1800.0,
        workers=1,
        out=str(out),
    )
    body = search(cfg, log=lambda _line: None)
    settings, written = read_weights_file(out)
    assert written["weights"] == body["weights"] and settings == settings_from_weights(body["weights"])
    training = written["training"]
    assert training["chosenAtGeneration"] in (0, 1, 2)
    assert training["beatHeuristic"] == (training["validationReward"] > training["heuristicValidationReward"])
    history = json.loads((tmp_path / "learned-history.json").read_text())
    assert [row["generation"] for row in history] == [1, 2] and all("val_reward" in row for row in history)
    code = rlsched_main(
        ["evaluate", "--mode", "dynamic", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd",
         "--rebalancer", f"none,learned:{out}", "--seeds", "1", "--jobs", "1", "--window", "1800",
         "--json", str(tmp_path / "e.json")]
    )  # fmt: skip
    assert code == 0 and "fgd+learned" in capsys.readouterr().out


def test_evaluate_refuses_a_bad_weights_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = write_openb(tmp_path, NODES, PODS)
    code = rlsched_main(
        ["evaluate", "--mode", "dynamic", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd",
         "--rebalancer", f"learned:{tmp_path / 'nope.json'}"]
    )  # fmt: skip
    assert code == 2 and "nope.json" in capsys.readouterr().err


def test_the_bundled_learned_weights_read_and_differ_from_the_heuristic() -> None:
    from rlsched.policy.learned import DEFAULT_MODEL

    path = DEFAULT_MODEL.parent / "rebalancer-openb.json"
    settings, body = read_weights_file(path)
    assert body["training"]["beatHeuristic"] is True
    assert settings != RebalanceSettings() and settings.latency_sensitive_hot_weight > 0
    assert "/" not in body["training"]["settings"]["nodes"], "no folder of the machine it was trained on"
