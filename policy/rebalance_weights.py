"""The rebalancer's weights by their SchedulingPolicy names, and the file a learned chooser is kept in.

One table (:data:`WEIGHTS`) gives every weight of :class:`rlsched.policy.rebalance.RebalanceSettings`
its ``spec.rebalance.weights`` name, default and bounds; the operator validates a SchedulingPolicy
against it, and ``rlsched train-rebalancer`` writes its result as the same names, so a learned chooser
is served by pasting its weights into a policy (or by ``rlsched evaluate --rebalancer learned:FILE``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from .rebalance import RebalanceSettings

FORMAT = "rlsched-rebalance-weights"
FORMAT_VERSION = 1
MAX_FILE_BYTES = 1 << 20
"""A weights file is a few hundred bytes; anything above a MiB is refused unread."""


# SchedulingPolicy name → (RebalanceSettings field, default, low, high, what it is)
WEIGHTS: dict[str, tuple[str, float, float, float, str]] = {
    "fragmentation": (
        "fragmentation_weight",
        1.0,
        0.0,
        1000.0,
        "weight of the stranded-GPU (FGD fragmentation) reduction",
    ),
    "hot": ("hot_weight", 1.0, 0.0, 1000.0, "weight of the hot-node (SLA risk) relief"),
    "migrationCost": ("migration_cost", 100.0, 0.0, 100000.0, "milli charged per move (the price of restarting a pod)"),
    "minGain": ("min_gain", 0.0, 0.0, 100000.0, "net gain (milli) a move must exceed"),
    "hotThreshold": ("hot_threshold", 0.9, 0.01, 1.0, "node CPU load (0..1) above which a node is hot"),
    "latencySensitiveHot": (
        "latency_sensitive_hot_weight",
        0.0,
        -1000.0,
        1000.0,
        "extra weight of the hot-node relief when the pod is latency-sensitive (hot + this must not be negative)",
    ),
    "latencySensitive": (
        "latency_sensitive_weight",
        0.0,
        -100000.0,
        100000.0,
        "milli added to moving a latency-sensitive pod (negative keeps them in place)",
    ),
    "podGpu": ("pod_gpu_weight", 0.0, -100.0, 100.0, "milli added per GPU milli the moved pod holds"),
    "destinationLoad": (
        "destination_load_weight",
        0.0,
        -1000.0,
        1000.0,
        "milli added per 0.001 of the destination's CPU load after the move (negative prefers cool nodes)",
    ),
}


def weight_problems(weights: Mapping[str, Any], where: str = "weights") -> list[str]:
    """What is wrong with a weights mapping (unknown names, values out of bounds), one line each."""
    unknown = sorted(str(k) for k in weights if k not in WEIGHTS)[:10]
    problems = [f"{where}.{k[:64]}: unknown field; valid fields: {', '.join(sorted(WEIGHTS))}" for k in unknown]
    for name, (_, default, low, high, _what) in WEIGHTS.items():
        value = weights.get(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            problems.append(f"{where}.{name}: {str(value)[:40]!r} must be a number from {low:g} to {high:g}")
    hot, ls_hot = weights.get("hot", 1.0), weights.get("latencySensitiveHot", 0.0)
    if not problems and hot + ls_hot < 0:
        problems.append(f"{where}.latencySensitiveHot: {ls_hot:g} makes hot + latencySensitiveHot negative")
    return problems


def settings_from_weights(weights: Mapping[str, Any], base: RebalanceSettings | None = None) -> RebalanceSettings:
    """``base`` (default: the defaults) with the named weights set; raises ValueError on any problem."""
    problems = weight_problems(weights)
    if problems:
        raise ValueError("; ".join(problems))
    fields: dict[str, Any] = {WEIGHTS[name][0]: float(value) for name, value in weights.items()}
    return replace(base or RebalanceSettings(), **fields)


def weights_of(settings: RebalanceSettings) -> dict[str, float]:
    """Every weight of ``settings`` by its SchedulingPolicy name."""
    return {name: float(getattr(settings, field)) for name, (field, *_rest) in WEIGHTS.items()}


def write_weights_file(path: str | Path, weights: Mapping[str, float], provenance: Mapping[str, Any]) -> None:
    """Write a learned chooser: its weights and how they were found."""
    body = {"format": FORMAT, "formatVersion": FORMAT_VERSION, "weights": dict(weights), "training": dict(provenance)}
    Path(path).write_text(json.dumps(body, indent=1) + "\n", encoding="utf-8")


def read_weights_file(path: str | Path) -> tuple[RebalanceSettings, dict[str, Any]]:
    """(settings, the whole file) of a learned chooser; raises ValueError saying what is wrong."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ValueError(f"{path}: larger than {MAX_FILE_BYTES} bytes; not a weights file")
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} file")
    if body.get("formatVersion") != FORMAT_VERSION:
        raise ValueError(f"{path}: format version {body.get('formatVersion')!r}, this version reads {FORMAT_VERSION}")
    weights = body.get("weights")
    if not isinstance(weights, dict):
        raise ValueError(f"{path}: 'weights' must be an object")
    try:
        return settings_from_weights(weights), body
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
