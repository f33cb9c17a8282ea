"""``spec.rebalance`` of a SchedulingPolicy: the rebalancer's switches, selectors, budgets and weights.

Parsed and validated like the rest of the spec (:func:`rlsched.operator.spec.parse_spec` calls
:func:`parse_rebalance`): the CRD's schema states the same bounds, and every problem names the field
and what fits. Everything a user writes here is bounded — numbers by ranges, the namespace selector
by counts and lengths — so a hostile or careless spec cannot make a cycle expensive.

Defaults are the cautious ones: off, and when switched on, dry-run (it only reports what it would
do) until ``dryRun: false``; one move per cycle, six per hour, one per controller per day.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlsched.policy.rebalance_weights import WEIGHTS, weight_problems
from rlsched.policy.spec_problems import unknown_keys

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
MAX_SELECTOR_TERMS = 32
"""matchLabels entries plus matchExpressions, at most."""
MAX_SELECTOR_VALUES = 64
"""Values of one matchExpressions term, at most."""
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
MAX_OWNER_WINDOW_S = 30 * 86400
"""The longest ``budget.ownerWindowSeconds`` (the CRD's maximum): the budget ledger keeps its records
this long whatever the spec says, the newest 1,000 at most (:mod:`.rebalance_budget`)."""

# name → (default, low, high, what it is); integers
_INTS: dict[str, tuple[int, int, int, str]] = {
    "intervalSeconds": (300, 10, 86400, "seconds between rebalancing cycles"),
    "minPodAgeSeconds": (600, 0, 30 * 86400, "seconds a pod must have run before it may be moved"),
}
_BUDGET: dict[str, tuple[int, int, int, str]] = {
    "maxMovesPerCycle": (1, 1, 50, "evictions per cycle"),
    "maxMovesPerHour": (6, 0, 1000, "evictions in any sliding hour"),
    "maxMovesPerOwner": (1, 1, 100, "evictions of one controller's pods per ownerWindowSeconds"),
    "ownerWindowSeconds": (86400, 60, MAX_OWNER_WINDOW_S, "seconds a controller's evictions count against it"),
}
# name → (default, low, high); numbers: the planner's one table (rlsched.policy.rebalance_weights).
# Gains are in milli, as rlsched.policy.rebalance counts them: 1000 = one GPU's worth of stranded
# capacity un-stranded, or a whole node's CPU off a hot node.
_WEIGHTS: dict[str, tuple[float, float, float]] = {
    name: (default, low, high) for name, (_, default, low, high, _what) in WEIGHTS.items()
}


@dataclass(frozen=True)
class Requirement:
    """One ``matchExpressions`` term of a label selector."""

    key: str
    operator: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        if self.operator == "In":
            return labels.get(self.key) in self.values
        return labels.get(self.key) not in self.values  # NotIn (a missing key matches, as in Kubernetes)


@dataclass(frozen=True)
class LabelSelector:
    """A Kubernetes label selector (``matchLabels`` and ``matchExpressions``, ANDed).

    An empty selector matches every namespace, as in Kubernetes; no selector at all (``None`` on the
    spec) opts in no namespace."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels) and all(
            r.matches(labels) for r in self.match_expressions
        )


@dataclass(frozen=True)
class RebalanceSpec:
    """A validated ``spec.rebalance`` with defaults applied (field docs: the CRD and docs/operator.md)."""

    enabled: bool = False
    dry_run: bool = True
    interval_s: int = 300
    min_pod_age_s: int = 600
    namespace_selector: LabelSelector | None = None
    max_moves_per_cycle: int = 1
    max_moves_per_hour: int = 6
    max_moves_per_owner: int = 1
    owner_window_s: int = 86400
    fragmentation_weight: float = 1.0
    hot_weight: float = 1.0
    migration_cost: float = 100.0
    min_gain: float = 0.0
    hot_threshold: float = 0.9
    latency_sensitive_hot_weight: float = 0.0
    latency_sensitive_weight: float = 0.0
    pod_gpu_weight: float = 0.0
    destination_load_weight: float = 0.0


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value  # not NaN


def _unknown(raw: Mapping[str, Any], known: set[str], where: str, problems: list[str]) -> None:
    for key in unknown_keys(set(raw) - known):
        problems.append(f"{where}.{key}: unknown field; valid fields: {', '.join(sorted(known))}")


def _ints(
    raw: Mapping[str, Any], table: dict[str, tuple[int, int, int, str]], where: str, problems: list[str]
) -> dict[str, int]:
    out = {}
    for key, (default, low, high, what) in table.items():
        value = raw.get(key, default)
        if not _is_int(value) or not low <= value <= high:
            problems.append(f"{where}.{key}: {str(value)[:40]!r} must be an integer from {low} to {high} ({what})")
            value = default
        out[key] = int(value)
    return out


def parse_selector(raw: Any, where: str, problems: list[str]) -> LabelSelector | None:
    """A bounded label selector; problems name the field (``spec.rebalance.namespaceSelector...``)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        problems.append(f"{where}: expected an object with matchLabels and/or matchExpressions")
        return None
    _unknown(raw, {"matchLabels", "matchExpressions"}, where, problems)
    labels = raw.get("matchLabels", {})
    exprs = raw.get("matchExpressions", [])
    if not isinstance(labels, Mapping):
        problems.append(f"{where}.matchLabels: expected an object of label keys to values")
        labels = {}
    if not isinstance(exprs, list):
        problems.append(f"{where}.matchExpressions: expected a list")
        exprs = []
    if len(labels) + len(exprs) > MAX_SELECTOR_TERMS:
        problems.append(f"{where}: at most {MAX_SELECTOR_TERMS} matchLabels and matchExpressions together")
        return None
    pairs: list[tuple[str, str]] = []
    for key, value in labels.items():
        if not isinstance(key, str) or len(key) > 317 or not _LABEL_KEY.fullmatch(key):
            problems.append(f"{where}.matchLabels: {str(key)[:64]!r} is not a label key")
        elif not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
            problems.append(f"{where}.matchLabels.{key}: {str(value)[:64]!r} is not a label value")
        else:
            pairs.append((key, value))
    terms: list[Requirement] = []
    for i, term in enumerate(exprs):
        w = f"{where}.matchExpressions[{i}]"
        if not isinstance(term, Mapping):
            problems.append(f"{w}: expected an object with key, operator and values")
            continue
        _unknown(term, {"key", "operator", "values"}, w, problems)
        key, op, values = term.get("key"), term.get("operator"), term.get("values") or []
        if not isinstance(key, str) or len(key) > 317 or not _LABEL_KEY.fullmatch(key):
            problems.append(f"{w}.key: {str(key)[:64]!r} is not a label key")
            continue
        if op not in OPERATORS:
            problems.append(f"{w}.operator: {str(op)[:40]!r} is not one of {', '.join(OPERATORS)}")
            continue
        if not isinstance(values, list) or len(values) > MAX_SELECTOR_VALUES:
            problems.append(f"{w}.values: expected a list of at most {MAX_SELECTOR_VALUES} label values")
            continue
        if any(not isinstance(v, str) or len(v) > 63 or not _LABEL_VALUE.fullmatch(v) for v in values):
            problems.append(f"{w}.values: every value must be a label value (63 characters at most)")
            continue
        if op in ("In", "NotIn") and not values:
            problems.append(f"{w}.values: {op} needs at least one value")
            continue
        if op in ("Exists", "DoesNotExist") and values:
            problems.append(f"{w}.values: {op} takes no values")
            continue
        terms.append(Requirement(key, str(op), frozenset(values)))
    return LabelSelector(tuple(sorted(pairs)), tuple(terms))


def parse_rebalance(raw: Any, problems: list[str]) -> RebalanceSpec:
    """``spec.rebalance`` (None: the defaults, i.e. off); appends to ``problems`` and returns defaults
    for the fields that failed, so every problem of a spec is reported at once."""
    where = "spec.rebalance"
    if raw is None:
        return RebalanceSpec()
    if not isinstance(raw, Mapping):
        problems.append(f"{where}: expected an object")
        return RebalanceSpec()
    known = {"enabled", "dryRun", "namespaceSelector", "budget", "weights", *_INTS}
    _unknown(raw, known, where, problems)
    flags: dict[str, bool] = {}
    for key, flag in (("enabled", False), ("dryRun", True)):
        value = raw.get(key, flag)
        if not isinstance(value, bool):
            problems.append(f"{where}.{key}: {str(value)[:40]!r} must be true or false")
            value = flag
        flags[key] = value
    ints = _ints(raw, _INTS, where, problems)
    budget_raw = raw.get("budget", {})
    if not isinstance(budget_raw, Mapping):
        problems.append(f"{where}.budget: expected an object")
        budget_raw = {}
    _unknown(budget_raw, set(_BUDGET), f"{where}.budget", problems)
    budget = _ints(budget_raw, _BUDGET, f"{where}.budget", problems)
    weights_raw = raw.get("weights", {})
    if not isinstance(weights_raw, Mapping):
        problems.append(f"{where}.weights: expected an object")
        weights_raw = {}
    problems.extend(weight_problems(weights_raw, f"{where}.weights"))  # the planner's own table and checks
    weights: dict[str, float] = {}
    for key, (default, low, high) in _WEIGHTS.items():
        number = weights_raw.get(key, default)
        weights[key] = float(number) if _is_number(number) and low <= number <= high else default
    selector = parse_selector(raw.get("namespaceSelector"), f"{where}.namespaceSelector", problems)
    return RebalanceSpec(
        enabled=flags["enabled"],
        dry_run=flags["dryRun"],
        interval_s=ints["intervalSeconds"],
        min_pod_age_s=ints["minPodAgeSeconds"],
        namespace_selector=selector,
        max_moves_per_cycle=budget["maxMovesPerCycle"],
        max_moves_per_hour=budget["maxMovesPerHour"],
        max_moves_per_owner=budget["maxMovesPerOwner"],
        owner_window_s=budget["ownerWindowSeconds"],
        fragmentation_weight=weights["fragmentation"],
        hot_weight=weights["hot"],
        migration_cost=weights["migrationCost"],
        min_gain=weights["minGain"],
        hot_threshold=weights["hotThreshold"],
        latency_sensitive_hot_weight=weights["latencySensitiveHot"],
        latency_sensitive_weight=weights["latencySensitive"],
        pod_gpu_weight=weights["podGpu"],
        destination_load_weight=weights["destinationLoad"],
    )


def schema_defaults() -> dict[str, Any]:
    """The defaults as the CRD states them (tests compare the two)."""
    return {
        "enabled": False,
        "dryRun": True,
        **{k: v[0] for k, v in _INTS.items()},
        "budget": {k: v[0] for k, v in _BUDGET.items()},
        "weights": {k: v[0] for k, v in _WEIGHTS.items()},
    }
