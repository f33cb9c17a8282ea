"""The SchedulingPolicy spec in domain terms, and the one validation the operator applies.

The CRD's structural schema (``crds/schedulingpolicy.yaml``) rejects most bad specs at the API
server; :func:`parse_spec` checks the same rules again (specs written before a CRD upgrade, a CRD
installed without validation, unit tests without an API server) and a few the schema cannot
express (a fallback name the installed code does not know). Every problem names the field and says
what fits, so the ``Degraded`` condition tells the user what to fix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml
import yarl

from rlsched.policy.decision_dataset import REWARD_DEFAULTS
from rlsched.policy.dynamic.objective_spec import Objective, parse_objective
from rlsched.policy.spec_problems import shown, unknown_keys

from .rebalance_spec import RebalanceSpec, parse_rebalance

GROUP = "rlsched.io"
VERSION = "v1alpha1"
PLURAL = "schedulingpolicies"
KIND = "SchedulingPolicy"
MODES = ("active", "shadow", "off")


_SHA256 = re.compile(r"^[a-f0-9]{64}$")
_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
"""A ConfigMap's name (Kubernetes' DNS-1123 subdomain; the CRD has the same pattern)."""
MAX_MESSAGE_CHARS = 4000
"""SpecError's message (all the problems joined) is cut to this length (rlsched.policy.spec_problems)."""


_URL = re.compile(r"^https?://[^\s]+$")


class SpecError(ValueError):
    """An invalid SchedulingPolicy spec; ``problems`` lists every field that needs fixing."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems)[:MAX_MESSAGE_CHARS])


def redact(url: str) -> str:
    """``url`` without its user and password, for messages, events and the bundle's ``source``."""
    try:
        u = yarl.URL(url)
    except (ValueError, TypeError):
        return url
    return str(u.with_user(None)) if u.user is not None or u.password is not None else url


@dataclass(frozen=True)
class ModelSource:
    """Where the model comes from: exactly one of the three."""

    configmap: str | None = None
    """ConfigMap name (in the policy's namespace)."""
    key: str | None = None
    """Key in that ConfigMap (``binaryData`` or ``data``)."""
    path: str | None = None
    """A path the extender reads itself."""
    url: str | None = None
    """An http(s) URL the operator downloads."""
    sha256: str | None = None
    """Expected sha256 of the file (hex)."""

    def describe(self) -> str:
        """Where the model comes from, for messages and the bundle's ``source`` (a URL's user and
        password left out)."""
        if self.configmap:
            return f"configmap {self.configmap}/{self.key}"
        return self.path or (redact(self.url) if self.url else None) or "none"


@dataclass(frozen=True)
class PolicySpec:
    """A validated spec with defaults applied."""

    mode: str = "active"
    model: ModelSource | None = None
    fallback: str = "fgd"
    deadline_ms: float = 100.0
    top_k: int = 1
    extender_weight: int | None = None
    reward_weights: dict[str, float] = field(default_factory=lambda: dict(REWARD_DEFAULTS))
    rebalance: RebalanceSpec = field(default_factory=lambda: RebalanceSpec())
    """``spec.rebalance``: the operator's rebalancer (:mod:`rlsched.operator.rebalance_spec`)."""
    objective: Objective = field(default_factory=Objective)
    """``spec.objective``: what the policy is judged and retrained by (β, weights, SLA thresholds;
    :mod:`rlsched.policy.dynamic.objective_spec`). The decision log records it."""

    def extender_settings(self, model_path: str | None) -> dict[str, Any]:
        """The extender's policy file (keys of ``rlsched.extender.settings.PolicySettings``).

        ``modelSha256`` is always there: ``spec.model.sha256`` with a model, null without one (or
        without a digest). The extender merges the policy file over its own base config, so a key left
        out kept the base config's digest — pinned for the extender's own model — and every model the
        operator rolled out was refused. For a ``path`` model the operator never sees the file: the
        extender checks its bytes itself and refuses others when it loads the file (a file replaced at
        the path after the rollout). A file that already serves, unchanged, is not loaded again for a
        new digest: the rollout's verification finds the other bytes and reports ``DigestMismatch`` at
        its deadline. A ConfigMap or URL model with ``sha256`` was checked when it was fetched; the
        extender checks the published copy again."""
        return {
            "mode": self.mode,
            "modelPath": model_path,
            "modelSha256": self.model.sha256 if self.model is not None and model_path is not None else None,
            "fallback": self.fallback,
            "deadlineMs": self.deadline_ms,
            "topK": self.top_k,
        }


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def fallback_names() -> list[str]:
    """Heuristics the installed code can serve (``rlsched.policy.scorers.scorer_names``)."""
    from rlsched.policy.scorers import scorer_names

    return scorer_names()


def parse_spec(spec: Mapping[str, Any] | None) -> PolicySpec:
    """A :class:`PolicySpec` from ``.spec``; raises :class:`SpecError` listing every problem."""
    problems: list[str] = []
    spec = dict(spec or {})
    known = {
        "mode",
        "model",
        "fallback",
        "deadlineMs",
        "topK",
        "extenderWeight",
        "rewardWeights",
        "rebalance",
        "objective",
    }
    for key in unknown_keys(set(spec) - known):
        problems.append(f"spec.{key}: unknown field; valid fields: {', '.join(sorted(known))}")

    mode = spec.get("mode", "active")
    if mode is False:  # unquoted `off` in YAML 1.1 parsers
        problems.append('spec.mode: got a boolean; write "off" in quotes')
    elif mode not in MODES:
        problems.append(f"spec.mode: {shown(mode)} is not one of {', '.join(MODES)}")

    fallback = spec.get("fallback", "fgd")
    names = fallback_names()
    if fallback not in names:
        problems.append(f"spec.fallback: {shown(fallback)} is not a known heuristic; choose one of {', '.join(names)}")

    deadline = spec.get("deadlineMs", 100)
    if not _number(deadline) or not 1 <= deadline <= 5000:
        problems.append(f"spec.deadlineMs: {shown(deadline)} must be a number from 1 to 5000 (milliseconds)")
    top_k = spec.get("topK", 1)
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not 0 <= top_k <= 1000:
        problems.append(f"spec.topK: {shown(top_k)} must be an integer from 0 to 1000")
    weight = spec.get("extenderWeight")
    if weight is not None and (not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= 100000):
        problems.append(f"spec.extenderWeight: {shown(weight)} must be an integer from 1 to 100000")

    rewards = dict(REWARD_DEFAULTS)
    raw_rewards = spec.get("rewardWeights") or {}
    if not isinstance(raw_rewards, Mapping):
        problems.append("spec.rewardWeights: expected an object")
        raw_rewards = {}
    for key in unknown_keys(set(raw_rewards) - set(REWARD_DEFAULTS)):
        problems.append(f"spec.rewardWeights.{key}: unknown weight; valid: {', '.join(REWARD_DEFAULTS)}")
    for key, value in raw_rewards.items():
        if key not in REWARD_DEFAULTS:
            continue
        elif not _number(value):
            problems.append(f"spec.rewardWeights.{key}: {shown(value)} is not a number")
        elif key == "placed" and not -1000 <= value <= 1000:
            problems.append(f"spec.rewardWeights.{key}: {shown(value)} must be from -1000 to 1000")
        elif key != "placed" and not 0 <= value <= 1000:
            problems.append(f"spec.rewardWeights.{key}: {shown(value)} must be from 0 to 1000 (it is a penalty)")
        else:
            rewards[key] = float(value)

    model = None
    raw_model = spec.get("model")
    if raw_model is not None:
        model = _parse_model(raw_model, problems)

    rebalance = parse_rebalance(spec.get("rebalance"), problems)
    objective, objective_problems = parse_objective(spec.get("objective"))
    problems += objective_problems

    if problems:
        raise SpecError(problems)
    return PolicySpec(
        mode=mode,
        model=model,
        fallback=fallback,
        deadline_ms=float(deadline),
        top_k=int(top_k),
        extender_weight=weight,
        reward_weights=rewards,
        rebalance=rebalance,
        objective=objective,
    )


def _parse_model(raw: Any, problems: list[str]) -> ModelSource | None:
    if not isinstance(raw, Mapping):
        problems.append("spec.model: expected an object with one of configMapKeyRef, path or url")
        return None
    known = {"configMapKeyRef", "path", "url", "sha256"}
    for key in unknown_keys(set(raw) - known):
        problems.append(f"spec.model.{key}: unknown field; valid fields: {', '.join(sorted(known))}")
    given = [k for k in ("configMapKeyRef", "path", "url") if k in raw]
    if len(given) != 1:
        problems.append(
            "set exactly one of spec.model.configMapKeyRef, spec.model.path or spec.model.url"
            + (f" (got {', '.join(given)})" if given else "")
        )
    sha = raw.get("sha256")
    if sha is not None and (not isinstance(sha, str) or not _SHA256.fullmatch(sha)):
        problems.append("spec.model.sha256: expected 64 lowercase hex digits (sha256sum of the .npz)")
    source = ModelSource(sha256=sha)
    if "configMapKeyRef" in raw:
        ref = raw["configMapKeyRef"]
        if not isinstance(ref, Mapping) or not ref.get("name") or not ref.get("key"):
            problems.append("spec.model.configMapKeyRef: needs name and key")
        else:
            name, key = ref["name"], ref["key"]
            if not isinstance(name, str) or len(name) > 253 or not DNS1123_SUBDOMAIN.fullmatch(name):
                problems.append(
                    f"spec.model.configMapKeyRef.name: {shown(name)} is not a ConfigMap name "
                    "(lowercase letters, digits, '-' and '.', starting and ending with a letter or digit)"
                )
            if not isinstance(key, str) or len(key) > 253 or not _KEY.fullmatch(key):
                problems.append(
                    "spec.model.configMapKeyRef.key: expected a ConfigMap key (letters, digits, '-', '_', '.')"
                )
            source = ModelSource(configmap=str(name), key=str(key), sha256=sha)
    if "path" in raw:
        path = raw["path"]
        if not isinstance(path, str) or not path.startswith("/") or len(path) < 2 or len(path) > 4096:
            problems.append(f"spec.model.path: {shown(path)} must be an absolute path the extender can read")
        else:
            source = ModelSource(path=path, sha256=sha)
    if "url" in raw:
        url = raw["url"]
        if not isinstance(url, str) or len(url) > 4096 or not _URL.fullmatch(url):
            problems.append(f"spec.model.url: {shown(url)} must be an http:// or https:// URL")
        else:
            source = ModelSource(url=url, sha256=sha)
    return source


def crd_manifest() -> dict[str, Any]:
    """The SchedulingPolicy CRD shipped with the package (``crds/schedulingpolicy.yaml``)."""
    text = resources.files("rlsched.operator").joinpath("crds/schedulingpolicy.yaml").read_text(encoding="utf-8")
    manifest: dict[str, Any] = yaml.safe_load(text)
    return manifest


def crd_manifests() -> list[dict[str, Any]]:
    """Every CRD the operator ships (SchedulingPolicy and kopf's peering resources)."""
    out: list[dict[str, Any]] = []
    for name in ("schedulingpolicy.yaml", "kopfpeering.yaml"):
        text = resources.files("rlsched.operator").joinpath(f"crds/{name}").read_text(encoding="utf-8")
        out.extend(d for d in yaml.safe_load_all(text) if d)
    return out
