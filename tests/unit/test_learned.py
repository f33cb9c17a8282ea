"""Loading a trained model as a scorer (policy/learned.py, policy/export.py) — numpy only."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from ppo_fixtures import filled_state, small_pods, small_typical

from rlsched.policy import TieBreak, decide, export, feasible_nodes, make_scorer
from rlsched.policy.export import MANIFEST_KEY, ModelFileError, build_manifest, file_digest, read_model, save_model
from rlsched.policy.features import CLUSTER_FEATURES, FEATURES
from rlsched.policy.learned import DEFAULT_MODEL, SERVED_MODEL, LearnedScorer, load_learned_scorer
from rlsched.policy.network import param_shapes


def write_model(path: Path, seed: int = 0, mode: str = "sample", **overrides) -> Path:
    rng = np.random.default_rng(seed)
    shapes = param_shapes(len(FEATURES), len(CLUSTER_FEATURES), (8, 8), 8)
    params = {k: rng.normal(scale=0.2, size=s).astype(np.float32) for k, s in shapes.items()}
    manifest = build_manifest(
        version="test-1",
        hidden=(8, 8),
        value_hidden=8,
        prior_scale=50.0,
        rank_scale=80.0,
        mode=mode,
        fgd_cpu_weight=0.8,
        typical_json=small_typical().to_json(),
        training={"test": True},
    )
    manifest.update(overrides)
    save_model(path, params, manifest)
    return path


def rewrite(path: Path, dest: Path, change) -> Path:
    """Copy a model file, letting ``change(arrays, manifest)`` edit it, without the exporter's checks."""
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    manifest = json.loads(arrays.pop(MANIFEST_KEY).tobytes())
    change(arrays, manifest)
    arrays[MANIFEST_KEY] = np.frombuffer(json.dumps(manifest).encode(), dtype=np.uint8)
    with open(dest, "wb") as f:
        np.savez(f, **arrays)
    return dest


def test_scorer_interface_and_identity(tmp_path: Path) -> None:
    path = write_model(tmp_path / "m.npz")
    scorer = make_scorer(f"ppo:{path}", small_typical())
    assert isinstance(scorer, LearnedScorer)
    assert scorer.version == "test-1" and scorer.digest == file_digest(path) and len(scorer.digest) == 64
    state = filled_state(1)
    tiebreak = TieBreak.seeded(state.num_nodes, 3)
    for pod in small_pods(20, 4):
        req = state.request(pod)
        nodes = feasible_nodes(state, req)
        if len(nodes) < 2:
            continue
        scores = scorer.score(state, req, nodes)
        assert scores.values.shape == (len(nodes),) and np.isfinite(scores.values).all()
        i = scorer.choose(scores, nodes, tiebreak)
        assert 0 <= i < len(nodes)
        cards = scorer.cards(state, req, int(nodes[i]), i, scores, tiebreak)
        assert len(cards) == req.num_gpu
        decision = decide(scorer, state, req, tiebreak)
        state.place(req, decision.node, decision.cards)


def test_greedy_mode_takes_the_best_logit(tmp_path: Path) -> None:
    scorer = load_learned_scorer(write_model(tmp_path / "m.npz", mode="greedy"), small_typical())
    state = filled_state(2)
    tiebreak = TieBreak.seeded(state.num_nodes, 1)
    req = state.request(small_pods(5, 1)[0])
    nodes = feasible_nodes(state, req)
    scores = scorer.score(state, req, nodes)
    assert scorer.choose(scores, nodes, tiebreak) == int(np.argmax(scorer.logits(scores, nodes, tiebreak)))
    assert load_learned_scorer(tmp_path / "m.npz", mode="sample").decision.mode == "sample"


def test_typical_pods_default_to_the_manifest(tmp_path: Path) -> None:
    scorer = load_learned_scorer(write_model(tmp_path / "m.npz"))
    assert len(scorer.encoder.typical) == len(small_typical())


@pytest.mark.parametrize(
    "what, change, message",
    [
        ("format", lambda a, m: m.update(format="other"), "format"),
        ("version", lambda a, m: m.update(formatVersion=99), "format version 99"),
        ("features", lambda a, m: m["features"].update(names=m["features"]["names"][:-1]), "feature schema"),
        ("feature version", lambda a, m: m["features"].update(version=0), "feature schema v0"),
        ("shape", lambda a, m: a.update(w1=a["w1"][:, :3]), "array w1 has shape"),
        ("missing array", lambda a, m: a.pop("v1"), "missing"),
        ("nan", lambda a, m: a["b1"].__setitem__(0, np.nan), "not finite"),
        ("mode", lambda a, m: m["decision"].update(mode="argmax"), "decision mode"),
        ("field", lambda a, m: m["network"].pop("priorScale"), "malformed field"),
        ("load", lambda a, m: m["features"].update(load="sometimes"), "features.load is 'sometimes'"),
        ("qos", lambda a, m: m["features"].update(qos="Live"), "features.qos is 'Live'"),
        ("rank scale", lambda a, m: m["decision"].update(rankScale=float("inf")), "decision.rankScale is 'inf'"),
        ("prior scale", lambda a, m: m["network"].update(priorScale=float("nan")), "network.priorScale is 'nan'"),
        ("cpu weight", lambda a, m: m["features"].update(fgdCpuWeight="50"), "features.fgdCpuWeight is '50'"),
        ("long version", lambda a, m: m.update(version="v" * 129), "version must be a string of 1 to 128"),
        ("many typical pods", lambda a, m: m.update(typicalPods=(m["typicalPods"] * 40)[:1025]), "1 to 1024 pods"),
        ("hold", lambda a, m: m.setdefault("training", {}).update(args={"hold_s": float("inf")}), "hold_s"),
        ("huge manifest", lambda a, m: m.update(training={"junk": [{}] * 100_000}), "its manifest holds"),
        ("infinite layer", lambda a, m: m["network"].update(hidden=[float("inf"), 16]), "OverflowError"),
        ("names not a list", lambda a, m: m["features"].update(names=5), "not a model this rlsched can read"),
        ("training a list", lambda a, m: m.update(training=[1]), "AttributeError"),
        ("actions a list", lambda a, m: m.update(actions=[1]), "AttributeError"),
        ("typical inf", lambda a, m: m["typicalPods"][0].update(cpuMilli=float("inf")), "typical pods"),
        ("typical huge", lambda a, m: m["typicalPods"][0].update(cpuMilli=1e30), "amounts must be from 0"),
        ("float64 beyond float32", lambda a, m: a.update(w_out=np.full(a["w_out"].shape, 1e300)), "as float32"),
    ],
)
def test_incompatible_files_are_refused(tmp_path: Path, what: str, change, message: str) -> None:
    bad = rewrite(write_model(tmp_path / "m.npz"), tmp_path / "bad.npz", change)
    with pytest.raises(ModelFileError, match=message):
        load_learned_scorer(bad)


def test_corrupt_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="no such file"):
        load_learned_scorer(tmp_path / "absent.npz")
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip file at all")
    with pytest.raises(ModelFileError, match="not a readable"):
        load_learned_scorer(junk)
    good = write_model(tmp_path / "m.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(good[: len(good) // 2])
    with pytest.raises(ModelFileError):
        load_learned_scorer(tmp_path / "cut.npz")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("w1.npy", b"")
    (tmp_path / "nomanifest.npz").write_bytes(buf.getvalue())
    with pytest.raises(ModelFileError):
        load_learned_scorer(tmp_path / "nomanifest.npz")


def test_save_refuses_a_bad_manifest(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError):
        save_model(tmp_path / "x.npz", {}, {"format": "rlsched-policy"})
    assert not (tmp_path / "x.npz").exists()


def npy_header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    """A .npy magic and header claiming ``shape``, written by hand: no data follows."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def repack(
    src: Path,
    dest: Path,
    replace: dict[str, bytes] | None = None,
    add: dict[str, bytes] | None = None,
    compression: int = zipfile.ZIP_STORED,
) -> Path:
    """Copy a model file member by member, replacing some members' bytes and appending others."""
    with zipfile.ZipFile(src) as old, zipfile.ZipFile(dest, "w", compression) as new:
        for info in old.infolist():
            new.writestr(info.filename, (replace or {}).get(info.filename, old.read(info)))
        for name, data in (add or {}).items():
            new.writestr(name, data)
    return dest


@pytest.mark.parametrize("path", sorted(DEFAULT_MODEL.parent.glob("*.npz")), ids=lambda p: p.name)
def test_every_bundled_model_loads(path: Path) -> None:
    params, manifest, _ = read_model(path)
    assert manifest["version"] and set(param_shapes(1, 1, (1, 1), 1)) <= set(params)


@pytest.mark.filterwarnings("ignore:Duplicate name")  # zipfile's, when the test writes w1.npy twice
@pytest.mark.parametrize("name", ["junk.npy", "notes.txt", "w1.npy"])
def test_unknown_or_repeated_members_are_refused_before_reading(tmp_path: Path, name: str) -> None:
    """A member the layout does not name (or a second copy of one it does) is refused from the
    archive's directory, its data unread: here a header claiming a petabyte."""
    good = write_model(tmp_path / "m.npz")
    bad = repack(good, tmp_path / "bad.npz", add={name: npy_header((10**15,))})
    with pytest.raises(ModelFileError, match=f"unexpected or repeated member '{name}'"):
        read_model(bad)


@pytest.mark.parametrize(
    "member, shape, hidden, message",
    [
        ("w1.npy", (10**15,), None, r"array w1 has shape \(1000000000000000,\)"),  # not the layout's shape
        ("__manifest__.npy", (10**15,), None, "array __manifest__: its header claims more data"),
        # the shape a (hostile) manifest asks for: refused as more than the member holds
        ("w1.npy", (len(FEATURES), 10**12), [10**12, 8], "array w1: its header claims more data"),
    ],
    ids=["array", "manifest", "manifest-agrees"],
)
def test_a_header_claiming_a_huge_array_is_refused_from_it(
    tmp_path: Path, member: str, shape: tuple[int, ...], hidden: list[int] | None, message: str
) -> None:
    """numpy allocates what a header claims before reading: such a member must be refused from its
    header with the model-file error, not by a MemoryError (or gigabytes of memory)."""
    good = write_model(tmp_path / "m.npz")
    if hidden is not None:
        good = rewrite(good, tmp_path / "hostile.npz", lambda a, m: m["network"].update(hidden=hidden))
    descr = "|u1" if member == MANIFEST_KEY + ".npy" else "<f4"
    bad = repack(good, tmp_path / "bad.npz", replace={member: npy_header(shape, descr) + bytes(64)})
    with pytest.raises(ModelFileError, match=message):
        read_model(bad)


def test_a_wrong_shape_is_refused_from_the_header(tmp_path: Path) -> None:
    """The header alone decides: the member holds no data, yet the message names both shapes."""
    bad = repack(
        write_model(tmp_path / "m.npz"), tmp_path / "bad.npz", replace={"w1.npy": npy_header((len(FEATURES), 9))}
    )
    with pytest.raises(
        ModelFileError, match=rf"array w1 has shape \({len(FEATURES)}, 9\), the layout says \({len(FEATURES)}, 8\)"
    ):
        read_model(bad)


def test_a_file_inflating_past_the_cap_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cap is on the members' uncompressed sizes, so a small deflated file cannot inflate past it."""
    zeros = rewrite(
        write_model(tmp_path / "m.npz"), tmp_path / "zeros.npz", lambda a, m: [v.fill(0) for v in a.values()]
    )
    packed = repack(zeros, tmp_path / "deflated.npz", compression=zipfile.ZIP_DEFLATED)
    read_model(packed)  # a deflated model under the cap loads
    with zipfile.ZipFile(packed) as z:
        total = sum(info.file_size for info in z.infolist())
    cap = packed.stat().st_size + 1
    assert total > cap
    monkeypatch.setattr(export, "MAX_MODEL_BYTES", cap)
    with pytest.raises(ModelFileError, match=f"hold {total:,} bytes uncompressed, more than a model's {cap:,}"):
        read_model(packed)


def test_bundled_model_loads_and_serves_without_torch() -> None:
    assert DEFAULT_MODEL.is_file(), "the bundled model must ship in rlsched/policy/models/"
    params, manifest, digest = read_model(DEFAULT_MODEL)
    assert manifest["training"]["traces"] and manifest["training"]["args"]["seed"] is not None
    sidecar = DEFAULT_MODEL.with_suffix(".json")
    assert json.loads(sidecar.read_text())["version"] == manifest["version"]
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any torch import fails
        "from rlsched.policy.learned import load_learned_scorer, DEFAULT_MODEL\n"
        "from rlsched.policy import ClusterState, NodeSpec, PodSpec, TieBreak, decide\n"
        "s = load_learned_scorer(DEFAULT_MODEL)\n"
        "st = ClusterState([NodeSpec(f'n{i}', 96000, 393216, 8, 'G2') for i in range(3)])\n"
        "d = decide(s, st, st.request(PodSpec('p', 8000, 1024, 1, 500)), TieBreak.seeded(3, 0))\n"
        "print(s.version, s.digest[:12], d.node, d.cards)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert manifest["version"] in out.stdout and digest[:12] in out.stdout


def test_the_served_model_is_the_bundled_prior_and_rule_with_a_fine_tuned_network() -> None:
    """docs/ppo.md, "A network that matters on the FGD protocol": its ablation (``ppo-prior:``) is the
    bundled model's, so what it adds over the bundled prior is its network alone."""
    served, served_manifest, _ = read_model(SERVED_MODEL)
    start, start_manifest, _ = read_model(DEFAULT_MODEL)
    assert json.loads(SERVED_MODEL.with_suffix(".json").read_text())["version"] == served_manifest["version"]
    for same in ("decision", "features", "typicalPods", "network", "actions"):
        assert served_manifest[same] == start_manifest[same], same
    assert set(served) == set(start)
    changed = {name for name in served if not np.array_equal(served[name], start[name])}
    assert changed == {"w_out"}, "evolution strategies search the score head's weights only"
    assert np.abs(served["w_out"]).sum() > 10 * np.abs(start["w_out"]).sum()  # 0.57 -> ~26: it can move choices
    training = served_manifest["training"]
    assert training["method"] == "es" and len(training["stages"]) == 3
    first, second, third = training["stages"]
    assert training["confirmation"]["exported"]
    assert first["exported"]["confirmation"]["exported"] and second["exported"]["confirmation"]["exported"]
    assert "--init policy/models/ppo-openb-default.npz" in first["command"]
    assert "--init runs/es/stage1.npz" in second["command"]
    assert third["command"] == training["command"]
    # each stage starts from the one before: v1 (the second stage's export), then this file
    assert training["init"]["sha256"] == second["exported"]["sha256"]
    assert training["init"]["version"] == second["exported"]["version"] == "ppo-openb-default-es-v1"
    assert training["traces"] == ["gpushare100", "default"]


@pytest.mark.parametrize("policies", ["fgd,ppo:{model}", "ppo:{model},ppo-prior:{model}"])
def test_rlsched_evaluate_runs_a_model(tmp_path: Path, capsys, policies: str) -> None:
    from ppo_fixtures import write_workload

    from rlsched.cli import main

    model = write_model(tmp_path / "m.npz")
    nodes, pods = write_workload(tmp_path / "w")
    code = main(
        [
            "evaluate",
            "--nodes",
            nodes,
            "--pods",
            pods,
            "--policy",
            policies.format(model=model),
            "--seeds",
            "1-2",
            "--jobs",
            "1",
            "--out",
            str(tmp_path / "out"),
            "--no-progress",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    for policy in policies.format(model=model).split(","):
        assert policy in out


def test_prior_only_is_the_same_model_with_the_network_zeroed(tmp_path: Path) -> None:
    """``ppo-prior:PATH`` (the ablation) scores every node by the prior alone, with the same features,
    typical pods and decision rule; ``ppo:PATH`` adds the network's output on top."""
    path = write_model(tmp_path / "m.npz")
    full = make_scorer(f"ppo:{path}", small_typical())
    prior = make_scorer(f"ppo-prior:{path}", small_typical())
    assert prior.name == "ppo-prior" and full.name == "ppo"
    assert prior.version == "test-1+prior-only" and prior.digest == full.digest
    assert prior.decision == full.decision
    state = filled_state(1)
    differs = 0
    for pod in small_pods(20, 4):
        req = state.request(pod)
        nodes = feasible_nodes(state, req)
        if len(nodes) < 2:
            continue
        s_full = full.score(state, req, nodes).values
        s_prior = prior.score(state, req, nodes).values
        cand = prior.last
        np.testing.assert_array_equal(s_prior, prior.network.prior_scale * cand.prior[cand.group])
        differs += int(not np.allclose(s_full, s_prior))
    assert differs > 0, "the test model's network must contribute something for this test to mean anything"


def test_evaluate_help_lists_every_policy() -> None:
    from rlsched.policy.cli_evaluate import POLICY_HELP
    from rlsched.policy.learned import LEARNED_PREFIXES
    from rlsched.policy.scorers import scorer_names

    assert set(POLICY_HELP) == set(scorer_names()) | {f"{p}PATH" for p in LEARNED_PREFIXES}


def _loaded(state_seed: int, load: bool) -> object:
    state = filled_state(state_seed)
    if load:
        rng = np.random.default_rng(state_seed)
        state.load[:] = rng.random(state.load.shape)
    return state


@pytest.mark.parametrize("live", [False, True])
def test_node_load_reaches_only_a_model_trained_with_it(tmp_path: Path, live: bool) -> None:
    """A model trained where load was unknown (the FGD protocol) serves with load unknown, as trained;
    one trained in the living cluster (``features.load: live``) reads it."""
    path = tmp_path / "m.npz"
    write_model(path, seed=3)
    if live:
        rewrite(path, path, lambda arrays, manifest: manifest["features"].update(load="live"))
    scorer = load_learned_scorer(path, small_typical())
    assert scorer.sees_load is live
    changed = 0
    for pod in small_pods(30, 5):
        unknown, known = _loaded(4, False), _loaded(4, True)
        req = unknown.request(pod)  # type: ignore[attr-defined]
        nodes = feasible_nodes(unknown, req)  # type: ignore[arg-type]
        if len(nodes) < 2:
            continue
        a = scorer.score(unknown, req, nodes).values  # type: ignore[arg-type]
        b = scorer.score(known, req, nodes).values  # type: ignore[arg-type]
        changed += not np.array_equal(a, b)
    assert (changed > 0) is live, changed


def test_trained_with_load_reads_the_field_or_the_training_mode() -> None:
    from rlsched.policy.export import trained_with_load

    assert trained_with_load({"features": {"load": "live"}})
    assert not trained_with_load({"features": {"load": "unknown"}})
    assert trained_with_load({"features": {}, "training": {"args": {"mode": "dynamic"}}})
    assert not trained_with_load({"features": {}, "training": {"args": {"mode": "fgd"}}})
    assert not trained_with_load({"features": {}, "training": {}})
    bundled = Path(__file__).parents[2] / "policy" / "models"
    assert not load_learned_scorer(bundled / "ppo-openb-default.npz").sees_load
    assert load_learned_scorer(bundled / "ppo-openb-dynamic.npz").sees_load


def _as_v1(arrays: dict, manifest: dict) -> None:
    """Turn a v2 model file into the v1 file it would have been: no QoS columns anywhere."""
    from rlsched.policy.features import FEATURES_V1

    keep = [FEATURES.index(name) for name in FEATURES_V1]
    arrays["w1"] = arrays["w1"][keep]
    manifest["features"].update(version=1, names=list(FEATURES_V1))
    manifest["features"].pop("qos", None)
    manifest["network"]["arrays"]["w1"] = [len(FEATURES_V1), manifest["network"]["arrays"]["w1"][1]]


def test_a_v1_model_file_is_read_as_v2_and_scores_exactly_as_before(tmp_path: Path) -> None:
    """Feature schema v2 only added the QoS columns: a v1 file gets zero weights for them and serves with
    them 0, so every node scores as it did (here against the same network with those rows zeroed)."""
    from rlsched.policy.features import QOS_FEATURES

    qos_rows = [FEATURES.index(name) for name in QOS_FEATURES]
    original = write_model(tmp_path / "m.npz", seed=5)
    zeroed = rewrite(original, tmp_path / "zeroed.npz", lambda a, m: a["w1"].__setitem__(qos_rows, 0.0))
    v1 = rewrite(zeroed, tmp_path / "v1.npz", _as_v1)
    params, manifest, _ = read_model(v1)
    assert manifest["features"]["version"] == 2 and manifest["features"]["upgradedFrom"] == 1
    assert manifest["features"]["qos"] == "unknown" and list(manifest["features"]["names"]) == list(FEATURES)
    assert params["w1"].shape == (len(FEATURES), 8) and not params["w1"][qos_rows].any()
    old, new = load_learned_scorer(zeroed, small_typical()), load_learned_scorer(v1, small_typical())
    assert not new.encoder.use_qos
    state = filled_state(2)
    for pod in small_pods(20, 8):
        req = state.request(pod)
        nodes = feasible_nodes(state, req)
        if len(nodes):
            assert np.array_equal(old.score(state, req, nodes).values, new.score(state, req, nodes).values)
    # a v1 file whose names are not exactly v1's is refused as before
    renamed = rewrite(v1, tmp_path / "renamed.npz", lambda a, m: m["features"]["names"].reverse())
    with pytest.raises(ModelFileError, match="feature schema v1"):
        read_model(renamed)


@pytest.mark.parametrize("live", [False, True])
def test_the_qos_class_reaches_only_a_model_trained_with_it(tmp_path: Path, live: bool) -> None:
    """``features.qos: live`` (``rlsched train --qos-features``): the pod's class and the nodes' counts of
    latency-sensitive pods reach the network; any other model sees them as 0, as trained."""
    from dataclasses import replace

    path = tmp_path / "m.npz"
    write_model(path, seed=6)
    if live:
        rewrite(path, path, lambda arrays, manifest: manifest["features"].update(qos="live"))
    scorer = load_learned_scorer(path, small_typical())
    assert scorer.encoder.use_qos is live
    state = filled_state(3)
    changed = 0
    for pod in small_pods(30, 9):
        plain, sensitive = state.request(pod), state.request(replace(pod, qos="LS"))
        assert sensitive.latency_sensitive and not plain.latency_sensitive
        nodes = feasible_nodes(state, plain)
        if len(nodes) < 2:
            continue
        a = scorer.score(state, plain, nodes).values
        b = scorer.score(state, sensitive, nodes).values
        changed += not np.array_equal(a, b)
    assert (changed > 0) is live, changed


def test_only_the_bundled_qos_model_reads_the_qos_columns() -> None:
    bundled = Path(__file__).parents[2] / "policy" / "models"
    for path in sorted(bundled.glob("*.npz")):
        scorer = load_learned_scorer(path)
        assert scorer.encoder.use_qos is (path.name == "ppo-openb-dynamic-qos.npz"), path.name
    assert load_learned_scorer(bundled / "ppo-openb-dynamic-qos.npz").sees_load


def test_a_manifest_nested_beyond_reason_is_refused_as_a_model_error(tmp_path: Path) -> None:
    good = write_model(tmp_path / "m.npz")
    with np.load(good) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays[MANIFEST_KEY] = np.frombuffer(b"[" * 100_000 + b"]" * 100_000, dtype=np.uint8)
    bad = tmp_path / "deep.npz"
    with open(bad, "wb") as f:
        np.savez(f, **arrays)
    with pytest.raises(ModelFileError, match="not valid JSON"):
        load_learned_scorer(bad)


def test_a_delay_head_logit_that_is_not_a_number_never_holds(tmp_path: Path) -> None:
    from rlsched.policy.delay_head import DELAY_INPUTS, DelayHead

    n = len(DELAY_INPUTS)
    with pytest.raises(ValueError, match="positive"):
        DelayHead(np.zeros(n), np.r_[1e-320, np.ones(n - 1)], np.zeros(n), -1.0)
    scorer = make_scorer(f"ppo:{write_model(tmp_path / 'm.npz')}", small_typical())
    head = DelayHead.never(np.zeros(n), np.ones(n))
    object.__setattr__(head, "logit", lambda state, req: float("nan"))
    scorer.delay_head = head
    state = filled_state(1)
    req = state.request(small_pods(1, 4)[0])
    assert scorer.verdict(state, req, feasible_nodes(state, req), None) is None


def test_an_evaluation_names_its_models_and_refuses_one_replaced_meanwhile(tmp_path: Path, monkeypatch) -> None:
    """Every run read the model file afresh, and the JSON did not say which file it was: a file replaced
    during an evaluation mixed two models in one column, unseen."""
    from ppo_fixtures import write_workload

    import rlsched.policy.evaluate as evaluate_module
    from rlsched.policy.export import read_model

    model = write_model(tmp_path / "m.npz")
    other = write_model(tmp_path / "other.npz", seed=1, version="test-2")
    nodes, pods = write_workload(tmp_path / "w")
    policies = [f"ppo:{model}", f"ppo-prior:{model}", "fgd", "FGD"]
    seeds = (s for s in (1, 2))  # a one-shot iterable: every policy must still play every seed
    evaluation = evaluate_module.evaluate(
        nodes, pods, evaluate_module.parse_policies(",".join(policies)), seeds, progress=False
    )
    _, _, sha256 = read_model(model)
    assert evaluation.to_json()["models"] == {
        f"ppo:{model}": {"sha256": sha256, "version": "test-1"},
        f"ppo-prior:{model}": {"sha256": sha256, "version": "test-1"},
    }
    assert [(s.policy, s.seeds) for s in evaluation.summaries()] == [
        (f"ppo:{model}", 2),
        (f"ppo-prior:{model}", 2),
        ("fgd", 2),
    ]
    assert f"model sha256 {sha256[:16]}, version test-1" in evaluate_module.format_table(evaluation)

    real = evaluate_module._run_one
    runs = []

    def replaced_after_the_first_run(task):
        runs.append(task)
        if len(runs) == 1:
            Path(model).write_bytes(Path(other).read_bytes())
        return real(task)

    monkeypatch.setattr(evaluate_module, "_run_one", replaced_after_the_first_run)
    with pytest.raises(ValueError, match="a model file changed during the evaluation"):
        evaluate_module.evaluate(nodes, pods, [f"ppo:{model}"], [1, 2], progress=False)
