"""Whether a pod may go on a node apart from resources: taints, nodeSelector, required node affinity.

kube-scheduler applies these rules in its own plugins before it asks the extender, so filter does not
repeat them (per node, in Python, they would cost the filter's latency budget). Bind does, on the one
node it is asked for, because bind's caller is not trusted: anything that can reach the verb could
otherwise place any pod anywhere. The semantics are kube-scheduler's (v1.37):

- TaintToleration / NodeUnschedulable: every ``NoSchedule`` or ``NoExecute`` taint of the node must be
  tolerated (``PreferNoSchedule`` is a preference); a cordoned node (``spec.unschedulable``) counts as
  the taint ``node.kubernetes.io/unschedulable:NoSchedule``. A toleration with an empty effect
  matches every effect, an empty key with ``Exists`` every key; ``Equal`` (the default) compares the
  value, ``Exists`` ignores it, ``Lt``/``Gt`` compare int64 values (taint < / > toleration).
- NodeAffinity: ``spec.nodeSelector`` (every key equal) AND the required node affinity, whose
  ``nodeSelectorTerms`` are ORed and, inside a term, ``matchExpressions`` and ``matchFields`` ANDed.
  A term with neither matches nothing, as does a term with a malformed requirement; an empty term
  list matches nothing. ``In``/``NotIn``/``Exists``/``DoesNotExist``/``Gt``/``Lt`` on labels (a
  missing label satisfies ``NotIn`` and ``DoesNotExist``; ``Gt``/``Lt`` need an int64 label value);
  ``matchFields`` supports ``In``/``NotIn`` with one value, on ``metadata.name``.

Objects are read into small frozen values (what the cache keeps instead of raw JSON). Kubernetes caps
no list here (a required ``In`` of 1,100 hostnames is valid), so no list has a cap of its own: the
entries of one object's lists and maps together are (:data:`MAX_ITEMS`), which bounds the work per
object and the memory per cached object. A requirement's key, operator or value longer than
:data:`MAX_STRING` fails its own term only, as kube-scheduler's validation of it would; anything
else malformed raises :class:`RuleError` naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_ITEMS = 100_000
"""At most this many entries in all of one object's lists and maps together (taints, labels,
tolerations, selector entries, terms, requirements, values). Kubernetes limits the object, not its
lists: a stored object is at most ~1.5 MiB (etcd's request limit), ~100,000 hostnames of 12
characters; reading that many takes ~30 ms. The watch reads events up to 16 MiB and a verb body up
to ``server.maxBodyBytes``, so the byte caps alone would allow millions of entries."""
MAX_STRING = 1024
"""Longest key or value kept (Kubernetes allows 317-character keys and 63-character label values)."""

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_INT_RE = re.compile(r"[+-]?[0-9]+")
"""What Go's strconv.ParseInt(s, 10, 64) reads (no spaces, no '_', ASCII digits, leading zeros too);
range checked after. Strings are at most MAX_STRING characters, so int() stays cheap."""
_CANONICAL_INT_RE = re.compile(r"0|-?[1-9][0-9]*")
"""A toleration's Lt/Gt operand: a decimal integer in canonical form (apimachinery's
``IsDecimalInteger``: no leading zero, no '+', no "-0")."""
_LABEL_VALUE_RE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
LABEL_VALUE_MAX = 63

UNSCHEDULABLE_TAINT_KEY = "node.kubernetes.io/unschedulable"
DO_NOT_SCHEDULE = frozenset({"NoSchedule", "NoExecute"})
LABEL_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})


class RuleError(ValueError):
    """A malformed taint, toleration, selector or affinity; ``field`` is its JSON path."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


class _Budget:
    """The entries one object may still have (:data:`MAX_ITEMS` in all its lists and maps)."""

    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = MAX_ITEMS

    def take(self, n: int, where: str) -> None:
        """Count ``n`` more entries; RuleError at ``where`` when the object has too many in all."""
        self.left -= n
        if self.left < 0:
            raise RuleError(
                where,
                f"brings the object over {MAX_ITEMS} entries in all (taints, labels, tolerations, "
                f"selector entries, terms, requirements and values together); at most {MAX_ITEMS} are read",
            )


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class Toleration:
    key: str
    operator: str
    """"" and "Equal" are the same; "Exists", "Lt", "Gt"; anything else tolerates nothing."""
    value: str
    effect: str


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class Term:
    """One ``nodeSelectorTerm``: every requirement must hold."""

    expressions: tuple[Requirement, ...]
    fields: tuple[Requirement, ...]


@dataclass(frozen=True)
class NodeFacts:
    """What the rules need of a node."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False


@dataclass(frozen=True)
class PodRules:
    """What the rules need of a pod."""

    tolerations: tuple[Toleration, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    required_terms: tuple[Term, ...] | None = None
    """``requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms``; None: no required affinity."""


NO_RULES = PodRules()


# -- reading objects ------------------------------------------------------------------------------


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if type(value) is dict:  # JSON from orjson: skip the ABC check
        return value
    if not isinstance(value, Mapping):
        raise RuleError(where, f"expected an object, got {type(value).__name__}")
    return value


def _list(value: Any, where: str, budget: _Budget) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise RuleError(where, f"expected a list, got {type(value).__name__}")
    budget.take(len(value), where)
    return value


def _str(value: Any, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise RuleError(where, f"expected a string, got {type(value).__name__}")
    if len(value) > MAX_STRING:
        raise RuleError(where, f"is {len(value)} characters long; at most {MAX_STRING} are supported")
    return value


def _term_str(value: Any, where: str) -> str:
    """A requirement's key, operator or value: a longer string than :data:`MAX_STRING` is cut to
    MAX_STRING + 1 characters (bounded memory), and its requirement is then made malformed
    (:data:`_UNREADABLE`) without the pod becoming unreadable: only the term fails, as in
    kube-scheduler (where a value longer than a label value fails its requirement's parsing, so even
    ``NotIn`` does not match)."""
    if isinstance(value, str) and len(value) > MAX_STRING:
        return value[: MAX_STRING + 1]
    return _str(value, where)


def _str_map(value: Any, where: str, budget: _Budget) -> dict[str, str]:
    m = _mapping(value, where)
    budget.take(len(m), where)
    return {_str(k, where): _str(v, f"{where}.{k}") for k, v in m.items()}


def node_facts(node: Any, where: str = "node") -> NodeFacts:
    """Labels, NoSchedule/NoExecute taints and ``spec.unschedulable`` of a v1.Node."""
    budget = _Budget()
    node = _mapping(node, where)
    meta = _mapping(node.get("metadata"), f"{where}.metadata")
    name = _str(meta.get("name"), f"{where}.metadata.name")
    labels = _str_map(meta.get("labels"), f"{where}.metadata.labels", budget)
    spec = _mapping(node.get("spec"), f"{where}.spec")
    taints = []
    for i, t in enumerate(_list(spec.get("taints"), f"{where}.spec.taints", budget)):
        w = f"{where}.spec.taints[{i}]"
        t = _mapping(t, w)
        effect = _str(t.get("effect"), f"{w}.effect")
        if effect in DO_NOT_SCHEDULE:  # PreferNoSchedule never blocks; not kept
            taints.append(Taint(_str(t.get("key"), f"{w}.key"), _str(t.get("value"), f"{w}.value"), effect))
    unschedulable = spec.get("unschedulable")
    if unschedulable is not None and not isinstance(unschedulable, bool):
        raise RuleError(f"{where}.spec.unschedulable", f"expected a boolean, got {type(unschedulable).__name__}")
    return NodeFacts(name=name, labels=labels, taints=tuple(taints), unschedulable=bool(unschedulable))


_UNREADABLE = ""
"""The operator of a requirement whose key, operator or a value is longer than MAX_STRING: no
operator, so the requirement is malformed and its term matches nothing (kube-scheduler's parsing
fails it)."""


def _requirement(r: Any, where: str, budget: _Budget, label: bool = True) -> Requirement:
    """One requirement; ``label``: of ``matchExpressions``, whose values kube-scheduler parses as label
    values (an over-long one fails the term), not of ``matchFields`` (a node name, compared as is)."""
    r = _mapping(r, where)
    raw = _list(r.get("values"), f"{where}.values", budget)
    values = tuple(_term_str(v, f"{where}.values[{j}]") for j, v in enumerate(raw))
    key, op = _term_str(r.get("key"), f"{where}.key"), _term_str(r.get("operator"), f"{where}.operator")
    if len(key) > MAX_STRING or len(op) > MAX_STRING or (label and any(len(v) > MAX_STRING for v in values)):
        op = _UNREADABLE  # NotIn with an over-long value must fail too, not exclude nothing
    return Requirement(key, op, values)


def pod_rules(pod: Any, where: str = "pod") -> PodRules:
    """Tolerations, nodeSelector and required node affinity of a v1.Pod (NO_RULES when it has none)."""
    budget = _Budget()
    pod = _mapping(pod, where)
    spec = _mapping(pod.get("spec"), f"{where}.spec")
    tolerations = []
    for i, t in enumerate(_list(spec.get("tolerations"), f"{where}.spec.tolerations", budget)):
        w = f"{where}.spec.tolerations[{i}]"
        t = _mapping(t, w)
        tolerations.append(
            Toleration(
                _str(t.get("key"), f"{w}.key"),
                _str(t.get("operator"), f"{w}.operator"),
                _str(t.get("value"), f"{w}.value"),
                _str(t.get("effect"), f"{w}.effect"),
            )
        )
    selector = _str_map(spec.get("nodeSelector"), f"{where}.spec.nodeSelector", budget)
    w = f"{where}.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    affinity = _mapping(
        _mapping(spec.get("affinity"), f"{where}.spec.affinity").get("nodeAffinity"),
        f"{where}.spec.affinity.nodeAffinity",
    )
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    terms: tuple[Term, ...] | None = None
    if required is not None:
        raw_terms = _list(_mapping(required, w).get("nodeSelectorTerms"), f"{w}.nodeSelectorTerms", budget)
        out = []
        for i, term in enumerate(raw_terms):
            tw = f"{w}.nodeSelectorTerms[{i}]"
            term = _mapping(term, tw)
            exprs = tuple(
                _requirement(r, f"{tw}.matchExpressions[{j}]", budget)
                for j, r in enumerate(_list(term.get("matchExpressions"), f"{tw}.matchExpressions", budget))
            )
            flds = tuple(
                _requirement(r, f"{tw}.matchFields[{j}]", budget, label=False)
                for j, r in enumerate(_list(term.get("matchFields"), f"{tw}.matchFields", budget))
            )
            out.append(Term(exprs, flds))
        terms = tuple(out)
    if not tolerations and not selector and terms is None:
        return NO_RULES
    return PodRules(tuple(tolerations), selector, terms)


# -- the rules ------------------------------------------------------------------------------------


def _int64(text: str, pattern: re.Pattern[str] = _INT_RE) -> int | None:
    if pattern.fullmatch(text) is None:
        return None
    value = int(text)
    return value if INT64_MIN <= value <= INT64_MAX else None


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """Toleration.ToleratesTaint."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    op = toleration.operator
    if op in ("", "Equal"):
        return toleration.value == taint.value
    if op == "Exists":
        return True
    if op in ("Lt", "Gt"):
        mine, theirs = _int64(toleration.value, _CANONICAL_INT_RE), _int64(taint.value, _CANONICAL_INT_RE)
        if mine is None or theirs is None:
            return False
        return theirs < mine if op == "Lt" else theirs > mine
    return False


def untolerated_taint(rules: PodRules, node: NodeFacts) -> Taint | None:
    """The first NoSchedule/NoExecute taint (cordon included) the pod does not tolerate, or None."""
    taints = node.taints
    if node.unschedulable:
        taints = (Taint(UNSCHEDULABLE_TAINT_KEY, "", "NoSchedule"), *taints)
    for taint in taints:
        if taint.effect in DO_NOT_SCHEDULE and not any(tolerates(t, taint) for t in rules.tolerations):
            return taint
    return None


def _label_requirement(r: Requirement, labels: Mapping[str, str]) -> bool | None:
    """labels.Requirement.Matches; None when the requirement is malformed (its term then fails)."""
    op, values = r.operator, r.values
    if op not in LABEL_OPERATORS:
        return None
    if not all(len(v) <= LABEL_VALUE_MAX and _LABEL_VALUE_RE.fullmatch(v) for v in values):
        return None  # NewRequirement validates every value as a label value: the term fails
    if op in ("In", "NotIn") and not values:
        return None
    if op in ("Exists", "DoesNotExist") and values:
        return None
    has = r.key in labels
    if op == "In":
        return has and labels[r.key] in values
    if op == "NotIn":
        return not has or labels[r.key] not in values
    if op == "Exists":
        return has
    if op == "DoesNotExist":
        return not has
    if len(values) != 1:  # Gt / Lt
        return None
    bound = _int64(values[0])
    if bound is None:
        return None
    if not has:
        return False
    value = _int64(labels[r.key])
    if value is None:
        return False
    return value > bound if op == "Gt" else value < bound


def _field_requirement(r: Requirement, node_name: str) -> bool | None:
    """A ``matchFields`` requirement: In/NotIn with exactly one value; ``metadata.name`` is the only
    field a node has (another key reads as "")."""
    if r.operator not in ("In", "NotIn") or len(r.values) != 1:
        return None
    value = node_name if r.key == "metadata.name" else ""
    return (value == r.values[0]) == (r.operator == "In")


def term_matches(term: Term, node: NodeFacts) -> bool:
    """One nodeSelectorTerm: expressions and fields ANDed; an empty or malformed term matches nothing."""
    if not term.expressions and not term.fields:
        return False
    for r in term.expressions:
        if not _label_requirement(r, node.labels):  # False or malformed
            return False
    if node.name:  # kube-scheduler skips field requirements for a node without a name
        for r in term.fields:
            if not _field_requirement(r, node.name):
                return False
    elif any(_field_requirement(r, "") is None for r in term.fields):
        return False
    return True


def selector_mismatch(rules: PodRules, node: NodeFacts) -> str | None:
    """Why the pod's nodeSelector / required node affinity rule the node out, or None."""
    for key, value in rules.node_selector.items():
        if node.labels.get(key) != value:
            shown = f"{key}={value}"
            return f"node does not match the pod's nodeSelector ({shown[:120]})"
    if rules.required_terms is not None and not any(term_matches(t, node) for t in rules.required_terms):
        return "node does not match the pod's required node affinity"
    return None


def refusal(rules: PodRules, node: NodeFacts) -> str | None:
    """Why kube-scheduler would not put the pod on the node (taints, selector, affinity), or None."""
    taint = untolerated_taint(rules, node)
    if taint is not None:
        what = f"{taint.key}={taint.value}:{taint.effect}" if taint.value else f"{taint.key}:{taint.effect}"
        return f"node has a taint the pod does not tolerate ({what[:160]})"
    return selector_mismatch(rules, node)
