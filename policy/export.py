"""The torch-free model file: numpy arrays plus a JSON manifest in one ``.npz``.

Layout: every parameter of :func:`rlsched.policy.network.param_shapes` as a float32 array under its
name, and ``__manifest__``: the UTF-8 bytes of a JSON object::

    format: "rlsched-policy", formatVersion: 1, version: "<model version>",
    features: {version, names[], fgdCpuWeight, load: "live" | "unknown"}   (whether node load was known in training),
    network:  {version, activation: "tanh", hidden: [h1, h2], valueHidden, priorScale, specialActions[],
               arrays{name: shape}},
    decision: {rankScale, mode},
    actions:  {delay: bool, reject: bool}        (special actions the model was trained to use),
    delayHead: {inputs[], holdS, training}       (optional: a learned hold rule, rlsched.policy.delay_head,
                                                  with its arrays delay_center, delay_scale, delay_weights, delay_bias)
    typicalPods: [...],                            (the workload model the features were computed with)
    training: {...}                                (provenance: command, seed, traces, time, metrics)

:func:`read_model` checks all of it and raises :class:`ModelFileError` saying what is wrong and what
to do; :func:`file_digest` is the sha256 the extender and operator report.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from .delay_head import ARRAYS as DELAY_ARRAYS
from .delay_head import check_manifest_entry
from .features import CLUSTER_FEATURES, FEATURE_VERSION, FEATURES
from .network import DECISION_MODES, NETWORK_VERSION, SPECIAL_ACTIONS, param_shapes

MODEL_FORMAT = "rlsched-policy"
FORMAT_VERSION = 1
MANIFEST_KEY = "__manifest__"


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
) -> dict[str, Any]:
    """The manifest for a model trained with the current feature schema and network layout.

    ``load_live``: node load was known in training (the living cluster); a model trained without it
    is served with load unknown (:func:`trained_with_load`)."""
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


def read_model(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, Any], str]:
    """(parameters, manifest, sha256) of a model file; raises :class:`ModelFileError` when it cannot be served."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(
            f"model file {path}: no such file (train one with `rlsched train` or use the bundled "
            "model, rlsched/policy/models/)"
        )
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise ModelFileError(
            f"model file {path}: not a readable .npz model ({exc}); re-export it with `rlsched train`"
        ) from None
    if MANIFEST_KEY not in arrays:
        raise ModelFileError(
            f"model file {path}: no manifest ({MANIFEST_KEY}); it was not written by rlsched's exporter"
        )
    try:
        manifest = json.loads(arrays.pop(MANIFEST_KEY).tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ModelFileError(f"model file {path}: the manifest is not valid JSON ({exc})") from None
    validate(manifest, arrays, str(path))
    return arrays, manifest, digest


def validate(manifest: Any, arrays: dict[str, np.ndarray], where: str) -> None:
    """Check a manifest against this code's schema and the arrays against the manifest."""

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
        float(net["priorScale"]), float(decision["rankScale"]), float(feats["fgdCpuWeight"])
        if feats.get("load", "unknown") not in ("live", "unknown"):
            raise ValueError(f"features.load is {feats.get('load')!r}, not 'live' or 'unknown'")
        manifest["typicalPods"], manifest["version"]
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
    shapes = param_shapes(len(FEATURES), len(CLUSTER_FEATURES), hidden, value_hidden)
    missing = sorted(set(shapes) - set(arrays))
    extra = sorted(set(arrays) - set(shapes) - set(DELAY_ARRAYS))
    if missing or extra:
        raise fail(f"arrays do not match the layout (missing {missing}, unexpected {extra})")
    for name, shape in shapes.items():
        a = arrays[name]
        if tuple(a.shape) != tuple(shape):
            raise fail(f"array {name} has shape {tuple(a.shape)}, the layout says {tuple(shape)}")
        if not np.issubdtype(a.dtype, np.floating) or not np.isfinite(a).all():
            raise fail(f"array {name} is not finite floating point")
    problem = check_manifest_entry(manifest.get("delayHead"), arrays)
    if problem is not None:
        raise fail(f"delay head: {problem}")
