"""Sinks and the rollout flow, against the extender's real policy engine (hot reload from files)."""

from __future__ import annotations

import base64
import logging
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from rlsched.operator.kube import KubeError
from rlsched.operator.rollout import ModelFetcher, Rollout, SourceError, serves
from rlsched.operator.sink import CURRENT, LAST_GOOD, Bundle, ConfigMapSink, DirectorySink, ModelTooLarge, SinkError
from rlsched.operator.spec import parse_spec
from rlsched.operator.testing import EngineExtender, FakeKube, fake_model

NS = "sched"


@pytest.fixture
def setup(tmp_path: Path):
    sink = DirectorySink(tmp_path / "policy")
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "policy.yaml").write_text("{}\n")
    kube = FakeKube()
    ext = EngineExtender(str(tmp_path / "policy" / "policy.yaml"))
    clock = {"t": 1000.0}

    async def sleep(s: float) -> None:
        clock["t"] += s

    import time

    rollout = Rollout(
        sink,
        ext,
        ModelFetcher(kube),
        timeout_s=5.0,
        poll_s=1.0,
        clock=lambda: time.time() + clock["t"] - 1000.0,
        sleep=sleep,
        monotonic=lambda: clock["t"],
    )
    yield sink, kube, ext, rollout
    ext.engine.close()


def model_cm(kube: FakeKube, name: str, data: bytes, key: str = "model.npz") -> None:
    kube.configmaps[(NS, name)] = {"metadata": {"name": name}, "binaryData": {key: base64.b64encode(data).decode()}}


def spec(**kw) -> dict:
    out = {"fallback": "least-allocated"}
    out.update(kw)
    return out


async def test_rollout_loads_and_keeps_last_good(setup) -> None:
    sink, kube, ext, rollout = setup
    model_cm(kube, "m1", fake_model("v1"))
    bundle = await rollout.build(
        NS, "default", 1, parse_spec(spec(model={"configMapKeyRef": {"name": "m1", "key": "model.npz"}}))
    )
    assert bundle.model_name and bundle.model_name.startswith("model-") and bundle.digest
    result = await rollout.apply(bundle)
    assert result.ok and result.reason == "RolledOut", result.message
    assert result.view.version == "v1" and result.view.model_path == sink.model_path(bundle.model_name)
    assert (await sink.read(LAST_GOOD)).same_content(bundle)
    assert ext.engine.model is not None and ext.engine.settings.fallback == "least-allocated"


async def test_bad_model_rolls_back_to_last_good(setup) -> None:
    sink, kube, ext, rollout = setup
    model_cm(kube, "m1", fake_model("v1"))
    good = await rollout.build(
        NS, "default", 1, parse_spec(spec(model={"configMapKeyRef": {"name": "m1", "key": "model.npz"}}))
    )
    assert (await rollout.apply(good)).ok
    model_cm(kube, "m2", b"\x00garbage, not a model")
    bad = await rollout.build(
        NS, "default", 2, parse_spec(spec(mode="shadow", model={"configMapKeyRef": {"name": "m2", "key": "model.npz"}}))
    )
    result = await rollout.apply(bad)
    assert not result.ok and result.reason == "ModelLoadFailed"
    assert "could not load the model" in result.message
    assert "rolled back to model" in result.message and result.rollback_ok
    assert result.rolled_back_to.same_content(good)
    assert (await sink.read(CURRENT)).same_content(good)
    assert ext.engine.model_info.version == "v1" and ext.engine.settings.mode == "active"
    # The failed model file was not kept as last good.
    assert (await sink.read(LAST_GOOD)).same_content(good)


async def test_bad_first_model_falls_back_to_the_heuristic(setup) -> None:
    sink, kube, ext, rollout = setup
    model_cm(kube, "m", b"not a model")
    bad = await rollout.build(
        NS, "default", 1, parse_spec(spec(model={"configMapKeyRef": {"name": "m", "key": "model.npz"}}))
    )
    result = await rollout.apply(bad)
    assert not result.ok and result.rollback_ok
    assert result.rolled_back_to.settings["modelPath"] is None and "rolled back to no model" in result.message
    assert ext.engine.model is None and ext.engine.settings.model_path is None


async def test_a_corrupt_last_good_slot_rolls_back_to_no_model(setup) -> None:
    sink, kube, ext, rollout = setup
    model_cm(kube, "m1", fake_model("v1"))
    good = await rollout.build(
        NS, "default", 1, parse_spec(spec(model={"configMapKeyRef": {"name": "m1", "key": "model.npz"}}))
    )
    assert (await rollout.apply(good)).ok
    (sink.directory / ".last-good" / "bundle.json").write_text("{truncated")
    model_cm(kube, "m2", b"\x00garbage, not a model")
    bad = await rollout.build(
        NS, "default", 2, parse_spec(spec(model={"configMapKeyRef": {"name": "m2", "key": "model.npz"}}))
    )
    result = await rollout.apply(bad)
    assert not result.ok and result.reason == "ModelLoadFailed" and result.rollback_ok
    assert result.rolled_back_to.settings["modelPath"] is None and "rolled back to no model" in result.message
    assert result.rolled_back_to.meta.get("generation") is None  # not the failed generation's
    assert ext.engine.model is None and ext.engine.settings.model_path is None
    assert await sink.read(LAST_GOOD) is None  # a synthesized no-model bundle is never "last good"


async def test_a_last_good_slot_that_cannot_be_read_now_retries_instead_of_dropping_the_model(
    setup, monkeypatch
) -> None:
    """One failed read (an API timeout) rolled back to no model: the extender dropped its working
    model, and the last-good slot was overwritten with the no-model bundle for good."""
    sink, kube, ext, rollout = setup
    model_cm(kube, "m1", fake_model("v1"))
    good = await rollout.build(
        NS, "default", 1, parse_spec(spec(model={"configMapKeyRef": {"name": "m1", "key": "model.npz"}}))
    )
    assert (await rollout.apply(good)).ok
    read = sink.read
    failures = [SinkError("cannot read last-good: 503 ServiceUnavailable")]

    async def flaky(slot: str) -> Bundle | None:
        if slot == LAST_GOOD and failures:
            raise failures.pop()
        return await read(slot)

    monkeypatch.setattr(sink, "read", flaky)
    model_cm(kube, "m2", b"\x00garbage, not a model")
    bad = await rollout.build(
        NS, "default", 2, parse_spec(spec(model={"configMapKeyRef": {"name": "m2", "key": "model.npz"}}))
    )
    with pytest.raises(SinkError, match="503"):
        await rollout.apply(bad)
    assert ext.engine.model is not None and ext.engine.model_info.version == "v1"  # the previous model serves
    result = await rollout.apply(bad)  # kopf retries: now the slot reads
    assert not result.ok and result.rollback_ok and result.rolled_back_to.meta.get("version") == "v1"
    assert ext.engine.model_info.version == "v1" and (await sink.read(LAST_GOOD)).meta.get("version") == "v1"


async def test_unreachable_extender_keeps_the_bundle_published(setup) -> None:
    sink, kube, ext, rollout = setup
    ext.reachable = False
    b = await rollout.build(NS, "default", 1, parse_spec(spec(mode="off")))
    result = await rollout.apply(b)
    assert not result.ok and result.reason == "ExtenderUnreachable" and result.rolled_back_to is None
    assert (await sink.read(CURRENT)).same_content(b)


async def test_timeout_when_the_extender_reads_other_files(setup, tmp_path: Path) -> None:
    _, kube, ext, _ = setup
    other = DirectorySink(tmp_path / "elsewhere")
    t = {"now": 0.0}

    async def sleep(s: float) -> None:
        t["now"] += s

    r = Rollout(
        other,
        ext,
        ModelFetcher(kube),
        timeout_s=3.0,
        poll_s=1.0,
        clock=lambda: t["now"],
        sleep=sleep,
        monotonic=lambda: t["now"],
    )
    b = await r.build(NS, "default", 1, parse_spec(spec(mode="shadow")))
    result = await r.apply(b)
    assert result.reason == "RolloutTimeout" and "did not report the new bundle" in result.message
    # Not marked as a known-bad generation: the extender may not have read the files (an older one
    # during an upgrade, a volume not mounted), and an operator restart tries again.
    assert (
        "rollbackOf" not in (await other.read(CURRENT)).meta or (await other.read(CURRENT)).meta["rollbackOf"] is None
    )


async def test_source_errors(setup) -> None:
    _, kube, _, rollout = setup
    with pytest.raises(SourceError) as err:
        await rollout.build(NS, "p", 1, parse_spec(spec(model={"configMapKeyRef": {"name": "absent", "key": "k"}})))
    assert err.value.temporary and "kubectl -n sched create configmap absent" in str(err.value)
    model_cm(kube, "m", b"x", key="other")
    with pytest.raises(SourceError) as err:
        await rollout.build(NS, "p", 1, parse_spec(spec(model={"configMapKeyRef": {"name": "m", "key": "k"}})))
    assert "has no key 'k' (keys: other)" in str(err.value)
    model_cm(kube, "m", b"x")
    with pytest.raises(SourceError) as err:
        await rollout.build(
            NS,
            "p",
            1,
            parse_spec(spec(model={"configMapKeyRef": {"name": "m", "key": "model.npz"}, "sha256": "0" * 64})),
        )
    assert err.value.reason == "DigestMismatch" and not err.value.temporary


@pytest.mark.parametrize(
    "url",
    [
        "http://example.invalid:99999/m.npz",  # port out of range
        "http://[::1/m.npz",  # unclosed IPv6 literal
        "http://:80/x",  # no host
        "http://" + "a" * 300 + ".com/m.npz",  # a DNS label over 63 characters: UnicodeError from idna
    ],
)
async def test_a_url_that_cannot_be_requested_is_not_retried(url: str) -> None:
    with pytest.raises(SourceError) as err:
        await ModelFetcher(None, timeout_s=2.0)._url(url)
    assert not err.value.temporary and err.value.reason == "InvalidSpec" and "spec.model.url" in str(err.value)


async def model_server(routes: dict) -> TestServer:
    """A local HTTP server: path → bytes (200) or ("redirect", location)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        what = routes.get(request.path)
        if what is None:
            return web.Response(status=404)
        if isinstance(what, tuple):
            return web.Response(status=302, headers={"Location": what[1]})
        return web.Response(body=what)

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    server = TestServer(app)
    await server.start_server()
    return server


async def test_a_model_url_follows_a_few_checked_redirects() -> None:
    server = await model_server({"/a": ("redirect", "/b"), "/b": ("redirect", "/model.npz"), "/model.npz": b"MODEL"})
    try:
        assert await ModelFetcher(None, timeout_s=5.0)._url(str(server.make_url("/a"))) == b"MODEL"
    finally:
        await server.close()


@pytest.mark.parametrize(
    "location, reason",
    [
        ("ftp://models.example/m.npz", "ModelSourceRedirect"),
        ("file:///etc/passwd", "ModelSourceRedirect"),
        ("http://169.254.169.254/latest/meta-data/iam/security-credentials/role", "ModelSourceRefused"),
        ("/loop", "ModelSourceRedirect"),  # more than MAX_REDIRECTS
    ],
)
async def test_a_model_url_may_not_redirect_elsewhere_than_http_or_to_instance_metadata(
    location: str, reason: str
) -> None:
    """The operator fetched whatever a model URL led to, and published the answer as the model:
    a redirect to the cloud's instance metadata put its credentials in a ConfigMap."""
    server = await model_server({"/m.npz": ("redirect", location), "/loop": ("redirect", "/loop")})
    try:
        with pytest.raises(SourceError) as err:
            await ModelFetcher(None, timeout_s=5.0)._url(str(server.make_url("/m.npz")))
    finally:
        await server.close()
    assert err.value.reason == reason and not err.value.temporary


async def test_a_link_local_model_url_is_refused_without_a_request() -> None:
    with pytest.raises(SourceError) as err:
        await ModelFetcher(None, timeout_s=2.0)._url("http://169.254.169.254/latest/meta-data/")
    assert err.value.reason == "ModelSourceRefused" and not err.value.temporary


async def test_a_model_urls_password_is_never_shown() -> None:
    server = await model_server({})
    url = str(server.make_url("/m.npz")).replace("http://", "http://reader:s3cret@")
    try:
        with pytest.raises(SourceError) as err:
            await ModelFetcher(None, timeout_s=5.0)._url(url)
    finally:
        await server.close()
    assert "HTTP 404" in str(err.value) and "s3cret" not in str(err.value)
    assert "s3cret" not in parse_spec(spec(model={"url": url})).model.describe()


async def test_path_model_is_not_copied(setup) -> None:
    _, _, _, rollout = setup
    b = await rollout.build(NS, "p", 3, parse_spec(spec(model={"path": "/models/p.npz"})))
    assert b.model is None and b.settings["modelPath"] == "/models/p.npz"


# -- sinks ----------------------------------------------------------------------------------------


async def test_directory_sink_roundtrip_and_gc(tmp_path: Path) -> None:
    sink = DirectorySink(tmp_path / "d")
    bundles = [
        Bundle(
            {"mode": "active", "modelPath": sink.model_path(f"model-{i:016x}.npz")},
            f"model-{i:016x}.npz",
            bytes([i]) * 10,
            {"digest": str(i), "generation": i},
        )
        for i in range(4)
    ]
    for b in bundles:
        await sink.write(CURRENT, b)
    got = await sink.read(CURRENT)
    assert got.same_content(bundles[-1]) and got.model == bundles[-1].model and got.meta["generation"] == 3
    # current and the one before it stay (the extender may still read the previous one).
    assert sorted(p.name for p in (tmp_path / "d").glob("model-*.npz")) == [
        bundles[2].model_name,
        bundles[3].model_name,
    ]
    assert (tmp_path / "d" / "policy.yaml").read_text().startswith("# Written by rlsched operator")
    assert await sink.read(LAST_GOOD) is None
    await sink.write(LAST_GOOD, bundles[1])
    assert (await sink.read(LAST_GOOD)).model == bundles[1].model
    await sink.clear(LAST_GOOD)
    assert await sink.read(LAST_GOOD) is None


async def test_a_directory_write_stopped_half_way_keeps_the_old_metadata(tmp_path: Path, monkeypatch) -> None:
    """The metadata (what the operator trusts: the generation published, a rollback's mark) is written
    last. Written before the policy file, a disk-full or a kill between the two left a rollback's mark
    beside the failed bundle's policy file, and every later run took the rollback for done."""
    from rlsched.operator import sink as sink_module

    sink = DirectorySink(tmp_path / "d")
    old, new = (
        Bundle(
            {"mode": "active", "modelPath": sink.model_path(f"model-{i:016x}.npz")},
            f"model-{i:016x}.npz",
            bytes([i]) * 10,
            {"generation": i, **({"rollbackOf": 2} if i == 1 else {})},
        )
        for i in (0, 1)
    )
    await sink.write(CURRENT, old)
    write = sink_module._atomic_write

    def disk_full_at_the_policy_file(path: Path, data: bytes) -> None:
        if path.name == "policy.yaml":
            raise OSError(28, "No space left on device")
        write(path, data)

    monkeypatch.setattr(sink_module, "_atomic_write", disk_full_at_the_policy_file)
    with pytest.raises(SinkError, match="No space left"):
        await sink.write(CURRENT, new)
    got = await sink.read(CURRENT)
    assert got is not None and got.same_content(old) and got.meta == old.meta | {"modelName": old.model_name}


async def test_corrupt_directory_slots_read_as_empty_and_are_reported_once(tmp_path: Path, caplog, monkeypatch) -> None:
    sink = DirectorySink(tmp_path / "d")
    good = Bundle({"mode": "active", "modelPath": sink.model_path("model-01.npz")}, "model-01.npz", b"m", {})
    slot = tmp_path / "d" / ".last-good"
    outside = tmp_path / "secret.npz"
    outside.write_bytes(b"not the slot's")
    corruptions = {
        "bundle.json": ["{truncated", "[1, 2]", '{"modelName": "../../secret.npz"}', '{"digest": 5}'],
        "policy.yaml": ["- a list\n", "mode: [unclosed\n", "modelPath: 5\n", "deadlineMs: fast\n", "topK: true\n"],
    }
    for name, texts in corruptions.items():
        for text in texts:
            await sink.write(LAST_GOOD, good)
            (slot / name).write_text(text)
            with caplog.at_level(logging.WARNING, "rlsched.operator.sink"):
                caplog.clear()
                assert await sink.read(LAST_GOOD) is None, (name, text)
                assert await sink.read(LAST_GOOD) is None
            assert len(caplog.records) == 1 and "corrupt, read as empty" in caplog.text, (name, text)
    await sink.write(LAST_GOOD, good)
    assert (await sink.read(LAST_GOOD)).same_content(good)

    def denied(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", denied)  # a file that cannot be read is not "corrupt": retried
    with pytest.raises(SinkError, match="cannot read .*Permission denied"):
        await sink.read(LAST_GOOD)


async def test_configmap_slots_corrupt_or_unreadable() -> None:
    kube = FakeKube()
    sink = ConfigMapSink(kube, "sched", "p")
    await sink.write(LAST_GOOD, Bundle({"mode": "active"}, "model-ab.npz", b"\x00\x01", {"digest": "ab"}))
    cm = kube.configmaps[("sched", "p-last-good")]
    for field, value in (
        ("binaryData", {"model-ab.npz": "not base64!"}),
        ("binaryData", {"model-ab.npz": 5}),
        ("data", ["policy.yaml"]),
        ("data", {"policy.yaml": "{}\n", "bundle.json": "{truncated"}),
    ):
        kube.configmaps[("sched", "p-last-good")] = dict(cm, **{field: value})
        assert await sink.read(LAST_GOOD) is None, (field, value)
    kube.fail["get_configmap"] = KubeError(503, "ServiceUnavailable", "etcd leader changed")
    with pytest.raises(SinkError, match="cannot read ConfigMap sched/p-last-good: 503"):
        await sink.read(LAST_GOOD)


def test_policy_yaml_quotes_off() -> None:
    import yaml

    from rlsched.operator.sink import policy_yaml

    assert yaml.safe_load(policy_yaml({"mode": "off", "modelPath": None})) == {"mode": "off", "modelPath": None}
    assert yaml.safe_load(policy_yaml({})) == {}


async def test_configmap_sink_roundtrip_and_size_limit() -> None:
    kube = FakeKube()
    sink = ConfigMapSink(kube, "sched", "rlsched-policy", "/etc/rlsched/policy", max_model_bytes=1000)
    b = Bundle(
        {"mode": "shadow", "modelPath": sink.model_path("model-ab.npz")},
        "model-ab.npz",
        b"\x00\x01" * 100,
        {"digest": "ab"},
    )
    await sink.write(CURRENT, b)
    cm = kube.configmaps[("sched", "rlsched-policy")]
    assert set(cm["data"]) == {"policy.yaml", "bundle.json"} and set(cm["binaryData"]) == {"model-ab.npz"}
    assert cm["metadata"]["labels"]["rlsched.io/slot"] == "current"
    assert (await sink.read(CURRENT)).model == b.model
    assert sink.model_path("model-ab.npz") == "/etc/rlsched/policy/model-ab.npz"
    await sink.write(LAST_GOOD, b)
    assert ("sched", "rlsched-policy-last-good") in kube.configmaps
    with pytest.raises(ModelTooLarge) as err:
        await sink.write(CURRENT, Bundle({"mode": "active"}, "model-big.npz", b"x" * 1001, {}))
    assert "spec.model.path" in str(err.value)


def test_serves_compares_what_matters() -> None:
    from rlsched.operator.extender_client import ExtenderView

    b = Bundle({"mode": "active", "modelPath": "/p/model-a.npz", "fallback": "fgd", "deadlineMs": 100.0, "topK": 1})
    v = ExtenderView(
        mode="active",
        fallback="fgd",
        deadline_ms=100.0,
        top_k=1,
        model_path="/p/model-a.npz",
        model_loaded=True,
        loaded_at=10.0,
    )
    assert serves(v, b)
    assert not serves(ExtenderView(**{**v.__dict__, "mode": "shadow"}), b)
    assert serves(ExtenderView(**{**v.__dict__, "error": "another file failed", "error_at": 11.0}), b)
    assert not serves(ExtenderView(**{**v.__dict__, "model_loaded": False}), b)
    assert serves(
        ExtenderView(mode="off", fallback="fgd"), Bundle({"mode": "off", "fallback": "fgd", "modelPath": None})
    )


def test_load_failed_only_counts_errors_about_our_file() -> None:
    from rlsched.operator.extender_client import ExtenderView
    from rlsched.operator.rollout import load_failed

    ours = Bundle({"mode": "shadow", "fallback": "fgd", "modelPath": "/p/model-1111111111111111.npz"})
    base = dict(
        mode="active", fallback="fgd", model_path="/p/model-2222222222222222.npz", model_loaded=True, error_at=10.0
    )
    other = ExtenderView(**base, error="ValueError: /p/model-3333333333333333.npz: corrupt")
    assert not load_failed(other, ours, since=5.0)  # the extender still retries the file we roll back from
    mine = ExtenderView(**base, error="ValueError: /p/model-1111111111111111.npz: corrupt")
    assert load_failed(mine, ours, since=5.0) and not load_failed(mine, ours, since=20.0)
    anonymous = ExtenderView(**base, error="ValueError: bad magic")
    assert not load_failed(anonymous, ours, since=5.0)  # still runs the old settings: not ours yet
    assert load_failed(ExtenderView(**{**base, "mode": "shadow"}, error="ValueError: bad magic"), ours, since=5.0)
    assert load_failed(ExtenderView(**base, error="x", error_path="/p/model-1111111111111111.npz"), ours, since=5.0)
    first = ExtenderView(
        mode="shadow",
        fallback="fgd",
        model_path="/p/model-1111111111111111.npz",
        model_loaded=False,
        error="bad",
        error_at=10.0,
    )
    assert load_failed(first, ours, since=5.0)


# -- link-local names, path digests ------------------------------------------------------------------


async def test_a_name_that_resolves_to_instance_metadata_is_refused_for_good(monkeypatch: pytest.MonkeyPatch) -> None:
    """The resolver's refusal arrives wrapped in aiohttp's ClientConnectorDNSError (a ClientError): it was
    reported as ModelSourceUnavailable and retried every 10 s forever, the reason lost."""
    import socket

    import aiohttp

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[dict]:
        return [{"hostname": host, "host": "169.254.169.254", "port": port, "family": family, "proto": 0, "flags": 0}]

    monkeypatch.setattr(aiohttp.ThreadedResolver, "resolve", resolve)
    with pytest.raises(SourceError) as err:
        await ModelFetcher(None, timeout_s=3.0)._url("http://metadata.google.internal/computeMetadata/v1/")
    assert err.value.reason == "ModelSourceRefused" and not err.value.temporary
    assert "resolves only to cloud instance metadata addresses" in str(err.value)


def test_serves_requires_the_bundles_digest() -> None:
    """Other bytes at the bundle's path are not the bundle: refresh and resume reported Ready (no Drift)
    for a path model whose file had been replaced."""
    from rlsched.operator.extender_client import ExtenderView
    from rlsched.operator.rollout import load_failed

    settings = {"mode": "active", "modelPath": "/m/p.npz", "fallback": "fgd", "deadlineMs": 100.0, "topK": 1}
    b = Bundle(settings, None, None, {"digest": "a" * 64})
    v = ExtenderView(mode="active", fallback="fgd", model_path="/m/p.npz", model_loaded=True, file_digest="a" * 64)
    assert serves(v, b)
    other = ExtenderView(**{**v.__dict__, "file_digest": "b" * 64})
    assert not serves(other, b) and serves(other, b, check_digest=False)
    assert serves(other, Bundle(settings))  # no digest to compare
    # the old bytes still serve while the new ones are not read yet: not a failure ...
    assert not load_failed(other, b, since=5.0)
    # ... until the extender reports that it refused (or failed) our file
    refused = ExtenderView(**{**other.__dict__, "error": "sha256 mismatch", "error_at": 10.0, "error_path": "/m/p.npz"})
    assert load_failed(refused, b, since=5.0) and not load_failed(refused, b, since=20.0)


async def test_a_path_model_whose_file_the_extender_has_not_read_yet_is_waited_for(setup, tmp_path: Path) -> None:
    """The file and spec.model.sha256 change together; the extender reads the file on its own timer. The
    operator compared the digest at the first /status answer and failed the rollout (DigestMismatch)."""
    sink, kube, ext, rollout = setup
    f = tmp_path / "m.npz"
    f.write_bytes(fake_model("v1"))
    import hashlib

    r1 = await rollout.apply(await rollout.build(NS, "p", 1, parse_spec(spec(model={"path": str(f)}))))
    assert r1.ok
    v2 = fake_model("v2-new")  # another size: the rewrite is seen even within one clock tick
    f.write_bytes(v2)
    real_poll, polls = ext.engine.poll, []

    async def late_poll() -> None:  # the extender's own timer: the first two /status answers come before it
        polls.append(1)
        if len(polls) > 2:
            await real_poll()

    ext.engine.poll = late_poll
    sha2 = hashlib.sha256(v2).hexdigest()
    r2 = await rollout.apply(await rollout.build(NS, "p", 2, parse_spec(spec(model={"path": str(f), "sha256": sha2}))))
    assert r2.ok, r2.message
    assert r2.view is not None and r2.view.file_digest == sha2 and r2.view.version == "v2-new"


async def test_a_path_model_with_other_bytes_fails_as_digest_mismatch_at_the_deadline(setup, tmp_path: Path) -> None:
    """An extender that loads the file but does not check its digest (an older one): DigestMismatch at
    the deadline, not at the first answer."""
    sink, kube, ext, rollout = setup
    f = tmp_path / "m.npz"
    f.write_bytes(fake_model("v1"))
    import dataclasses

    b = await rollout.build(NS, "p", 1, parse_spec(spec(model={"path": str(f)})))  # no modelSha256 to check
    result = await rollout.apply(dataclasses.replace(b, meta=dict(b.meta, digest="0" * 64)))
    assert not result.ok and result.reason == "DigestMismatch"
    # Not final: the file may arrive later, or the extender be upgraded; an operator restart retries.
    assert (await sink.read(CURRENT)).meta.get("rollbackOf") is None
    assert "expected " + "0" * 64 in result.message and ext.polls >= 5  # it waited for rolloutTimeoutS
