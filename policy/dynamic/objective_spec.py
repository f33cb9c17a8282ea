"""``SchedulingPolicy.spec.objective``: the objective's β, weights and SLA thresholds as a cluster writes them.

One parser for every reader: the operator validates the field (and records it in the decision log,
so a retrain knows what the served policy was asked to optimize), and ``rlsched evaluate --mode
dynamic`` and ``rlsched train --mode dynamic`` take it from a SchedulingPolicy file
(``--objective-from``). Field names are the CRD's (camelCase); every default is the one
:class:`~rlsched.policy.dynamic.objective.ObjectiveWeights` and
:class:`~rlsched.policy.dynamic.objective.SlaSettings` state with their reasons.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..spec_problems import shown, unknown_keys
from .objective import ObjectiveWeights, SlaSettings

FIELDS: dict[str, tuple[float, float, bool]] = {
    "beta": (0.0, 1.0, True),
    "slaWeight": (0.0, 1000.0, True),
    "strandedWeight": (0.0, 1000.0, True),
    "latencyScaleSeconds": (0.0, 86400.0, False),
    "slaCpuThreshold": (0.0, 1.0, False),
    "slaGpuThreshold": (0.0, 1.0, False),
}
"""Field → (lower, upper, lower bound included); the upper bound is always included."""

MAX_FILE_BYTES = 1 << 20
"""A SchedulingPolicy file larger than this is refused unread (a policy is a few KiB)."""


@dataclass(frozen=True)
class Objective:
    """What a run is judged by: the weights of the combined objective and the SLA thresholds."""

    weights: ObjectiveWeights = field(default_factory=ObjectiveWeights)
    sla: SlaSettings = field(default_factory=SlaSettings)

    def to_spec(self) -> dict[str, float]:
        """The ``spec.objective`` that parses back to this (every field, defaults included)."""
        return {
            "beta": self.weights.beta,
            "slaWeight": self.weights.sla,
            "strandedWeight": self.weights.stranded,
            "latencyScaleSeconds": self.weights.latency_scale_s,
            "slaCpuThreshold": self.sla.cpu_threshold,
            "slaGpuThreshold": self.sla.gpu_threshold,
        }


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def parse_objective(raw: Any, where: str = "spec.objective") -> tuple[Objective, list[str]]:
    """The :class:`Objective` of a ``spec.objective`` mapping (absent fields: defaults), and every problem.

    Problems name the field (``where`` is its path) and say what fits; with problems the returned
    objective is the default one and must not be used.
    """
    if raw is None:
        return Objective(), []
    if not isinstance(raw, Mapping):
        return Objective(), [f"{where}: expected an object with any of {', '.join(FIELDS)}"]
    problems: list[str] = []
    values: dict[str, float] = {}
    for key in unknown_keys(set(raw) - set(FIELDS)):
        problems.append(f"{where}.{key}: unknown field; valid fields: {', '.join(FIELDS)}")
    for key, (low, high, low_included) in FIELDS.items():
        if key not in raw:
            continue
        value = raw[key]
        ok = _number(value) and (low <= value if low_included else low < value) and value <= high
        if not ok:
            bound = "from" if low_included else "above"
            problems.append(f"{where}.{key}: {shown(value)} must be a number {bound} {low:g} to {high:g}")
        else:
            values[key] = float(value)
    if problems:
        return Objective(), problems
    default = Objective().to_spec()
    given = {**default, **values}
    return (
        Objective(
            weights=ObjectiveWeights(
                beta=given["beta"],
                sla=given["slaWeight"],
                stranded=given["strandedWeight"],
                latency_scale_s=given["latencyScaleSeconds"],
            ),
            sla=SlaSettings(cpu_threshold=given["slaCpuThreshold"], gpu_threshold=given["slaGpuThreshold"]),
        ),
        [],
    )


def read_objective(path: str | Path) -> Objective:
    """``spec.objective`` of the SchedulingPolicy in a YAML or JSON file (the first document of that kind).

    Raises ``ValueError`` naming the file and every problem; a policy without ``spec.objective``
    gives the defaults.
    """
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: no such file")
    if p.stat().st_size > MAX_FILE_BYTES:
        raise ValueError(f"{p}: larger than {MAX_FILE_BYTES} bytes; not a SchedulingPolicy")
    text = p.read_text(encoding="utf-8", errors="replace")
    try:
        docs = [json.loads(text)] if p.suffix == ".json" else list(yaml.safe_load_all(text))
    except (ValueError, yaml.YAMLError) as exc:
        raise ValueError(f"{p}: not YAML or JSON: {str(exc).splitlines()[0]}") from None
    policies = [d for d in docs if isinstance(d, Mapping) and d.get("kind") == "SchedulingPolicy"]
    if not policies:
        raise ValueError(f"{p}: no SchedulingPolicy in it")
    spec = policies[0].get("spec") or {}
    if not isinstance(spec, Mapping):
        raise ValueError(f"{p}: spec is not an object")
    objective, problems = parse_objective(spec.get("objective"))
    if problems:
        raise ValueError(f"{p}: " + "; ".join(problems))
    return objective
