"""The torch-free model file: numpy arrays plus a JSON manifest in one ``.npz``.

Layout: every parameter of :func:`rlsched.policy.network.param_shapes` as a float32 array under its
name, and ``__manifest__``: the UTF-8 bytes of a JSON object::

    format: "rlsched-policy", formatVersion: 1, version: "<model version>",
    features: {version, names[], fgdCpuWeight,
               load: "live" | "unknown",      (whether node load was known in training)
               qos: "live" | "unknown"},      (whether the QoS columns were filled in training)
    network:  {version, activation: "tanh", hidden: [h1, h2], valueHidden, priorScale, specialActions[],
               arrays{name: shape}},
    decision: {rankScale, mode},
    actions:  {delay: bool, reject: bool}        (special actions the model was trained to use),
    delayHead: {inputs[], holdS, training}       (optional: a learned hold rule, rlsched.policy.delay_head,
                                                  with its arrays delay_center, delay_scale, delay_weights, delay_bias)
    typicalPods: [...],                            (the workload model the features were computed with)
    training: {...}                                (provenance: command, seed, traces, time, metrics)

:func:`read_model` checks all of it (each member's name, size and ``.npy`` header before its data: the files
come from users) and raises :class:`ModelFileError` saying what is wrong and what to do; :func:`file_digest` is
the sha256 the extender and operator report. A file written with feature schema v1 is read as v2
(:func:`upgrade_v1`): v2 only added the QoS columns, and a v1 network reads them with zero weights,
so it scores every node exactly as before.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import tempfile
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .delay_head import ARRAYS as DELAY_ARRAYS
from .delay_head import DELAY_INPUTS, DelayHead, check_manifest_entry
from .features import CLUSTER_FEATURES, FEATURE_VERSION, FEATURES, FEATURES_V1
from .network import DECISION_MODES, NETWORK_VERSION, SPECIAL_ACTIONS, param_shapes

MODEL_FORMAT = "rlsched-policy"
FORMAT_VERSION = 1
MANIFEST_KEY = "__manifest__"

MAX_MODEL_BYTES = 64 * 1024 * 1024
MAX_MANIFEST_BYTES = 256 * 1024
"""Largest manifest read (the bundled ones are 8–14 KiB; 1,024 typical pods take about 100 KiB): a
manifest of tens of megabytes compresses to a few kilobytes and would cost gigabytes parsed."""
MAX_VERSION_CHARS = 128
"""A model's version string is copied into every decision record: it must stay short."""
MAX_TYPICAL_PODS = 1024
"""Typical pods a model may carry (openb's have 35): every decision's fragmentation measure runs over
them, and so does the fallback heuristic built from them."""
"""The most a model file may hold, its members' uncompressed sizes summed (and the largest file read): 64 MiB,
the operator's download limit (``ModelFetcher.max_bytes``, operator/rollout.py). The bundled models are ~50 KB.
The extender and operator read files users supply (a path, a URL, a ConfigMap of up to 1 MiB), and a deflated
member inflates a thousandfold: without this bound a 900 KB file costs ~900 MiB of memory."""

_DELAY_SHAPES = {
    k: tuple(v.shape)
    for k, v in DelayHead.never(np.zeros(len(DELAY_INPUTS)), np.ones(len(DELAY_INPUTS))).arrays().items()
}
"""The shapes of the delay head's arrays (:data:`DELAY_ARRAYS`), as the head writes them."""

_MEMBERS = frozenset(
    f"{name}.npy"
    for name in (*param_shapes(len(FEATURES), len(CLUSTER_FEATURES), (1, 1), 1), *DELAY_ARRAYS, MANIFEST_KEY)
)
"""The member names a model file may hold (the arrays' names do not depend on the layer sizes)."""

_NPY: Any = np.lib.format
"""numpy's ``.npy`` reader, which numpy leaves unannotated."""


class ModelFileError(ValueError):
    """A model file that cannot be served: missing, corrupt, or made for another feature schema."""


def file_digest(path: str | Path) -> str:
    """sha256 of the file's bytes (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build_manifest(
    *,
    version: str,
    hidden: tuple[int, int],
    value_hidden: int,
    prior_scale: float,
    rank_scale: float,
    mode: str,
    fgd_cpu_weight: float,
    typical_json: list[dict[str, Any]],
    training: dict[str, Any],
    allow_delay: bool = False,
    allow_reject: bool = False,
    load_live: bool = False,
    qos_live: bool = False,
) -> dict[str, Any]:
    """The manifest for a model trained with the current feature schema and network layout.

    ``load_live``: node load was known in training (the living cluster); a model trained without it
    is served with load unknown (:func:`trained_with_load`). ``qos_live``: the QoS columns were filled
    in training; a model trained without them is served with them 0 (:func:`trained_with_qos`)."""
    h1, h2 = hidden  # a list from JSON too
    shapes = param_shapes(len(FEATURES), len(CLUSTER_FEATURES), (h1, h2), value_hidden)
    return {
        "format": MODEL_FORMAT,
        "formatVersion": FORMAT_VERSION,
        "version": version,
        "features": {
            "version": FEATURE_VERSION,
            "names": list(FEATURES),
            "fgdCpuWeight": float(fgd_cpu_weight),
            "load": "live" if load_live else "unknown",
            "qos": "live" if qos_live else "unknown",
        },
        "network": {
            "version": NETWORK_VERSION,
            "activation": "tanh",
            "hidden": list(hidden),
            "valueHidden": value_hidden,
            "priorScale": float(prior_scale),
            "specialActions": list(SPECIAL_ACTIONS),
            "arrays": {k: list(v) for k, v in shapes.items()},
        },
        "decision": {"rankScale": float(rank_scale), "mode": mode},
        "actions": {"delay": bool(allow_delay), "reject": bool(allow_reject)},
        "typicalPods": typical_json,
        "training": training,
    }


def trained_with_load(manifest: dict[str, Any]) -> bool:
    """Whether the model saw live node load in training: ``features.load``, or for a file written before
    that field, its training mode (only the living cluster, ``dynamic``, has load)."""
    load = (manifest.get("features") or {}).get("load")
    if load is not None:
        return bool(load == "live")
    return bool(((manifest.get("training") or {}).get("args") or {}).get("mode") == "dynamic")


def trained_with_qos(manifest: dict[str, Any]) -> bool:
    """Whether the QoS columns were filled in training (``features.qos``; never for a v1 model)."""
    return bool((manifest.get("features") or {}).get("qos") == "live")


def upgrade_v1(manifest: Any) -> bool:
    """Turn a feature-schema v1 manifest into v2, in place; False, and nothing changed, for anything else.

    v2 inserted the QoS columns; every other column keeps its meaning and scale. With the first layer
    grown by :func:`v1_first_layer` the network computes what it did, and the model is served with the
    QoS columns 0 (``qos: unknown``), as it was trained."""
    feats = manifest.get("features") if isinstance(manifest, dict) else None
    if not isinstance(feats, dict) or feats.get("version") != 1 or list(feats.get("names") or []) != list(FEATURES_V1):
        return False
    feats.update(version=FEATURE_VERSION, names=list(FEATURES), qos="unknown", upgradedFrom=1)
    net = manifest.get("network")
    if isinstance(net, dict) and isinstance(net.get("arrays"), dict) and isinstance(net["arrays"].get("w1"), list):
        net["arrays"]["w1"] = [len(FEATURES), *net["arrays"]["w1"][1:]]
    return True


def v1_first_layer(w1: np.ndarray) -> np.ndarray:
    """A v1 model's ``w1`` (one row per v1 feature) with a zero row inserted for each new column."""
    grown = np.zeros((len(FEATURES), *w1.shape[1:]), dtype=w1.dtype)
    grown[[FEATURES.index(name) for name in FEATURES_V1]] = w1
    return grown


def save_model(path: str | Path, params: dict[str, np.ndarray], manifest: dict[str, Any]) -> str:
    """Write the model atomically (temp file + rename); returns its sha256 digest."""
    validate(manifest, params, str(path))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {k: np.asarray(v, dtype=np.float32) for k, v in params.items()}
    arrays[MANIFEST_KEY] = np.frombuffer(json.dumps(manifest, indent=1, sort_keys=True).encode(), dtype=np.uint8)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            # numpy's stub types its allow_pickle keyword as bool, and a dict of arrays could name it; ours never does
            np.savez(f, **arrays)  # type: ignore[arg-type]
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return file_digest(path)


UNREADABLE = (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, RecursionError, RuntimeError)
"""What reading a hand-made manifest can raise (a list where an object belongs, an infinite size,
an encrypted zip member): each becomes a :class:`ModelFileError`."""


def read_model(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, Any], str]:
    """(parameters, manifest, sha256) of a model file; raises :class:`ModelFileError` when it cannot be served."""
    path = Path(path)
    if not path.is_file():  # a device or a FIFO (``/dev/zero``) would never end: a regular file only
        raise ModelFileError(
            f"model file {path}: no such file (train one with `rlsched train` or use the bundled "
            "model, rlsched/policy/models/)"
        )
    if path.stat().st_size > MAX_MODEL_BYTES:
        raise ModelFileError(f"model file {path}: larger than {MAX_MODEL_BYTES:,} bytes; it is not an rlsched model")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            arrays, manifest = _read_members(z, str(path))
        validate(manifest, arrays, str(path))
    except ModelFileError:
        raise
    except (zipfile.BadZipFile, OSError, EOFError, MemoryError, NotImplementedError, zlib.error) as exc:
        raise ModelFileError(
            f"model file {path}: not a readable .npz model ({exc}); re-export it with `rlsched train`"
        ) from None
    except UNREADABLE as exc:  # a field of the wrong type or size anywhere in the manifest
        raise ModelFileError(
            f"model file {path}: not a model this rlsched can read ({type(exc).__name__}: {str(exc)[:200]})"
        ) from None
    return arrays, manifest, digest


def _read_members(z: zipfile.ZipFile, where: str) -> tuple[dict[str, np.ndarray], Any]:
    """(arrays, manifest) of an open model file, every member's name, size and ``.npy`` header checked before
    its data is read: numpy allocates the shape a header claims before reading a byte, and a deflated member
    can inflate far beyond the file, so a small file could otherwise cost gigabytes or raise MemoryError."""

    def fail(msg: str) -> ModelFileError:
        return ModelFileError(f"model file {where}: {msg}")

    members: dict[str, zipfile.ZipInfo] = {}
    for info in z.infolist():
        if info.filename not in _MEMBERS or info.filename[:-4] in members:
            raise fail(
                f"unexpected or repeated member {info.filename!r} (a model holds {MANIFEST_KEY} and the arrays of "
                "the network and delay head); it was not written by rlsched's exporter"
            )
        members[info.filename[:-4]] = info
    total = sum(info.file_size for info in members.values())
    if total > MAX_MODEL_BYTES:
        raise fail(f"its members hold {total:,} bytes uncompressed, more than a model's {MAX_MODEL_BYTES:,}")
    if MANIFEST_KEY not in members:
        raise fail(f"no manifest ({MANIFEST_KEY}); it was not written by rlsched's exporter")
    if members[MANIFEST_KEY].file_size > MAX_MANIFEST_BYTES:
        raise fail(f"its manifest holds {members[MANIFEST_KEY].file_size:,} bytes, more than {MAX_MANIFEST_BYTES:,}")
    raw = _read_npy(z, members.pop(MANIFEST_KEY), None, fail)
    try:
        manifest = json.loads(raw.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise fail(f"the manifest is not valid JSON ({str(exc)[:200]})") from None
    v1 = upgrade_v1(manifest)
    shapes = {**_layout(manifest, where), **_DELAY_SHAPES}
    if v1 and "w1" in shapes:
        shapes["w1"] = (len(FEATURES_V1), *shapes["w1"][1:])
    arrays = {name: _read_npy(z, info, shapes[name], fail) for name, info in members.items()}
    if v1 and "w1" in arrays:
        arrays["w1"] = v1_first_layer(arrays["w1"])
    return arrays, manifest


def _read_npy(
    z: zipfile.ZipFile, info: zipfile.ZipInfo, shape: tuple[int, ...] | None, fail: Callable[[str], ModelFileError]
) -> np.ndarray:
    """One ``.npy`` member: floating point of ``shape``, or (``shape`` None) the manifest's 1-D bytes —
    refused from its header when it is not, or claims more data than the member holds."""
    name = info.filename[:-4]
    with z.open(info) as f:
        version = _NPY.read_magic(f)
        if version not in ((1, 0), (2, 0)):
            raise fail(f"array {name}: .npy format version {version} is not 1.0 or 2.0")
        header = _NPY.read_array_header_1_0(f) if version == (1, 0) else _NPY.read_array_header_2_0(f)
    found: tuple[int, ...] = tuple(header[0])
    dtype: np.dtype[Any] = header[2]
    if shape is None:
        if len(found) != 1 or dtype != np.uint8:
            raise fail(f"the manifest is {dtype} of shape {found}, not the bytes of a JSON object")
    elif found != shape:
        raise fail(f"array {name} has shape {found}, the layout says {shape}")
    elif not np.issubdtype(dtype, np.floating):
        raise fail(f"array {name} is {dtype}, not floating point")
    if math.prod(found) * dtype.itemsize > info.file_size:
        raise fail(f"array {name}: its header claims more data than the member's {info.file_size:,} bytes")
    with z.open(info) as f:
        array: np.ndarray = _NPY.read_array(f, allow_pickle=False)
    return array


def validate(manifest: Any, arrays: dict[str, np.ndarray], where: str) -> None:
    """Check a manifest against this code's schema and the arrays against the manifest."""
    shapes = _layout(manifest, where)

    def fail(msg: str) -> ModelFileError:
        return ModelFileError(f"model file {where}: {msg}")

    missing = sorted(set(shapes) - set(arrays))
    extra = sorted(set(arrays) - set(shapes) - set(DELAY_ARRAYS))
    if missing or extra:
        raise fail(f"arrays do not match the layout (missing {missing}, unexpected {extra})")
    for name, shape in shapes.items():
        a = arrays[name]
        if tuple(a.shape) != tuple(shape):
            raise fail(f"array {name} has shape {tuple(a.shape)}, the layout says {tuple(shape)}")
        # finite as float32, which the network computes in: 1e300 in a float64 array is inf there
        with np.errstate(over="ignore"):
            finite = np.issubdtype(a.dtype, np.floating) and bool(np.isfinite(a.astype(np.float32)).all())
        if not finite:
            raise fail(f"array {name} is not finite floating point (as float32)")
    problem = check_manifest_entry(manifest.get("delayHead"), arrays)
    if problem is not None:
        raise fail(f"delay head: {problem}")


def _layout(manifest: Any, where: str) -> dict[str, tuple[int, ...]]:
    """Check a manifest against this code's schema; the shape of every network array it describes."""

    def fail(msg: str) -> ModelFileError:
        return ModelFileError(f"model file {where}: {msg}")

    if not isinstance(manifest, dict) or manifest.get("format") != MODEL_FORMAT:
        raise fail(f"format is not {MODEL_FORMAT!r}")
    if manifest.get("formatVersion") != FORMAT_VERSION:
        raise fail(
            f"format version {manifest.get('formatVersion')!r}; this rlsched reads version {FORMAT_VERSION} — "
            "upgrade rlsched or re-export the model"
        )
    try:
        feats, net, decision = manifest["features"], manifest["network"], manifest["decision"]
        hidden = tuple(int(h) for h in net["hidden"])
        value_hidden = int(net["valueHidden"])
        for where_, number in (
            ("network.priorScale", net["priorScale"]),
            ("decision.rankScale", decision["rankScale"]),
            ("features.fgdCpuWeight", feats["fgdCpuWeight"]),
        ):
            if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
                raise ValueError(f"{where_} is {str(number)[:40]!r}, not a finite number")
        version = manifest["version"]
        if not isinstance(version, str) or not 0 < len(version) <= MAX_VERSION_CHARS:
            raise ValueError(f"version must be a string of 1 to {MAX_VERSION_CHARS} characters")
        typical = manifest["typicalPods"]
        if not isinstance(typical, list) or not 0 < len(typical) <= MAX_TYPICAL_PODS:
            raise ValueError(f"typicalPods must list 1 to {MAX_TYPICAL_PODS} pods")
        for key in ("load", "qos"):
            if feats.get(key, "unknown") not in ("live", "unknown"):
                raise ValueError(f"features.{key} is {feats.get(key)!r}, not 'live' or 'unknown'")
    except (KeyError, TypeError, ValueError) as exc:
        raise fail(f"manifest is missing or has a malformed field ({exc!r})") from None
    if feats.get("version") != FEATURE_VERSION or list(feats.get("names", [])) != list(FEATURES):
        raise fail(
            f"trained with feature schema v{feats.get('version')}, this rlsched computes v{FEATURE_VERSION} "
            f"({len(FEATURES)} features); retrain the model with this version"
        )
    if net.get("version") != NETWORK_VERSION or net.get("activation") != "tanh" or len(hidden) != 2:
        raise fail(
            f"network layout v{net.get('version')} ({net.get('activation')}) "
            f"is not v{NETWORK_VERSION} (tanh, 2 hidden layers)"
        )
    if list(net.get("specialActions", [])) != list(SPECIAL_ACTIONS):
        raise fail(f"special actions {net.get('specialActions')} differ from {list(SPECIAL_ACTIONS)}")
    if decision.get("mode") not in DECISION_MODES:
        raise fail(f"decision mode {decision.get('mode')!r} is not one of {', '.join(DECISION_MODES)}")
    return param_shapes(len(FEATURES), len(CLUSTER_FEATURES), hidden, value_hidden)
