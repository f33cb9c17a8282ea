"""Test helpers shipped with the package: an in-memory Kubernetes for the operator's own calls, an
extender stand-in built on the extender's real policy engine, and small fake models.

- :class:`FakeKube` — ConfigMaps, pod annotation patches, pod conditions and events in memory.
- :class:`EngineExtender` — the :class:`~rlsched.operator.extender_client.ExtenderClient` interface
  over a real :class:`rlsched.extender.policy.PolicyEngine` reading the policy file the operator
  publishes: every ``status()`` polls the engine first, so the rollout meets the extender's real
  hot-reload semantics (and its ``/status`` format) without HTTP.
- Fake models: :func:`fake_model` writes bytes :func:`fake_model_loader` accepts — a heuristic with a
  ``version``, optionally delaying the first N requests or rejecting pods above a CPU size (the
  extender's ``verdict`` seam). Anything else fails to load, like a corrupt model.
- ``python -m rlsched.operator.testing extender [rlsched extender flags]`` runs the real extender with
  :func:`fake_model_loader` (the e2e tests use it until learned models exist).
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .extender_client import ExtenderUnavailable, ExtenderView
from .kube import KubeError

if TYPE_CHECKING:
    from rlsched.policy.scorers import Scorer

MAGIC = "rlsched-test-model"


# -- fake models -------------------------------------------------------------------------------------


def fake_model(
    version: str,
    scorer: str = "least-allocated",
    delay_first: int = 0,
    retry_after_s: float = 1.0,
    reject_cpu_milli_above: int | None = None,
) -> bytes:
    """Bytes of a test model (see the module docstring)."""
    return json.dumps(
        {
            "magic": MAGIC,
            "version": version,
            "scorer": scorer,
            "delayFirst": delay_first,
            "retryAfterSeconds": retry_after_s,
            "rejectCpuMilliAbove": reject_cpu_milli_above,
        },
        sort_keys=True,
    ).encode()


class FakeModelScorer:
    """A heuristic posing as a learned model, with the ``verdict`` hook."""

    def __init__(self, inner: Scorer, conf: Mapping[str, Any], digest: str):
        self.inner, self.conf = inner, dict(conf)
        self.name = f"test:{conf['version']}"
        self.version = str(conf["version"])
        self.digest = digest
        self.calls = 0

    def score(self, state: Any, req: Any, nodes: Any) -> Any:
        return self.inner.score(state, req, nodes)

    def choose(self, scores: Any, nodes: Any, tiebreak: Any) -> int:
        return self.inner.choose(scores, nodes, tiebreak)

    def cards(self, *args: Any) -> Any:
        return self.inner.cards(*args)

    def verdict(self, state: Any, req: Any, nodes: Any, scores: Any) -> tuple[str, str, float] | None:
        self.calls += 1
        limit = self.conf.get("rejectCpuMilliAbove")
        if limit is not None and req.cpu_milli > int(limit):
            return ("reject", f"asks {req.cpu_milli} mCPU, more than this policy places ({limit})", 0.0)
        if self.calls <= int(self.conf.get("delayFirst") or 0):
            # The same reason every time, as a real policy would give: kube-scheduler then sees no
            # change in the pod's PodScheduled condition and does not retry the pod by itself.
            return ("delay", "test delay", float(self.conf.get("retryAfterSeconds") or 1.0))
        return None


def fake_model_loader(path: str, typical: Any) -> FakeModelScorer:
    """The extender's ``model_loader`` for :func:`fake_model` files; anything else fails to load."""
    from rlsched.policy.scorers import make_scorer

    data = open(path, "rb").read()
    try:
        conf = json.loads(data)
    except ValueError:
        raise ValueError(f"{path}: not a model file (corrupt or truncated)") from None
    if not isinstance(conf, dict) or conf.get("magic") != MAGIC:
        raise ValueError(f"{path}: not a model file (no manifest)")
    return FakeModelScorer(
        make_scorer(conf.get("scorer", "least-allocated"), typical), conf, hashlib.sha256(data).hexdigest()
    )


# -- the extender, in process ------------------------------------------------------------------------


class EngineExtender:
    """``status()``/``decisions()`` over a real PolicyEngine that reads ``policy_file``."""

    def __init__(self, policy_file: str, loader: Any = fake_model_loader, fallback: str = "least-allocated"):
        from rlsched.extender.decision_ring import DecisionRing
        from rlsched.extender.policy import PolicyEngine
        from rlsched.extender.settings import PolicySettings

        self.engine = PolicyEngine(PolicySettings(mode="active", fallback=fallback), policy_file, loader)
        self.engine.start(strict_model=False)
        self.ring = DecisionRing(64)
        self.reachable = True
        self.polls = 0

    async def status(self) -> ExtenderView:
        if not self.reachable:
            raise ExtenderUnavailable("GET http://extender/status: ConnectionRefusedError")
        self.polls += 1
        await self.engine.poll()
        return ExtenderView.from_status({"policy": self.engine.status()})

    async def decisions(self, after: int, limit: int = 1000) -> dict[str, Any]:
        if not self.reachable:
            raise ExtenderUnavailable("GET http://extender/decisions: ConnectionRefusedError")
        return self.ring.read(after, limit)

    async def close(self) -> None:
        self.engine.close()


# -- Kubernetes, in memory ---------------------------------------------------------------------------


class FakeKube:
    """The operator's own API calls against dicts."""

    def __init__(self) -> None:
        self.configmaps: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.calls: list[tuple[Any, ...]] = []
        self.fail: dict[str, KubeError] = {}
        self.rv = 100

    def _maybe_fail(self, what: str) -> None:
        if what in self.fail:
            raise self.fail[what]

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._maybe_fail("get_configmap")
        cm = self.configmaps.get((namespace, name))
        return copy.deepcopy(cm) if cm else None

    async def put_configmap(
        self,
        namespace: str,
        name: str,
        data: Mapping[str, str],
        binary_data: Mapping[str, str],
        labels: Mapping[str, str] | None = None,
    ) -> None:
        self.calls.append(("put_configmap", namespace, name))
        self._maybe_fail("put_configmap")
        self.rv += 1
        self.configmaps[(namespace, name)] = {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": dict(labels or {}),
                "resourceVersion": str(self.rv),
            },
            "data": dict(data),
            "binaryData": dict(binary_data),
        }

    async def delete_configmap(self, namespace: str, name: str) -> None:
        self.calls.append(("delete_configmap", namespace, name))
        self.configmaps.pop((namespace, name), None)

    def add_pod(self, namespace: str, name: str, uid: str, annotations: Mapping[str, str] | None = None) -> None:
        self.pods[(namespace, name)] = {
            "metadata": {"namespace": namespace, "name": name, "uid": uid, "annotations": dict(annotations or {})},
            "status": {"conditions": []},
        }

    async def patch_pod_annotations(
        self, namespace: str, name: str, uid: str, annotations: Mapping[str, str]
    ) -> dict[str, Any]:
        self.calls.append(("patch_pod", namespace, name, dict(annotations)))
        self._maybe_fail("patch_pod")
        pod = self.pods.get((namespace, name))
        if pod is None:
            raise KubeError(404, "NotFound", f'pods "{name}" not found')
        if pod["metadata"]["uid"] != uid:
            raise KubeError(409, "Conflict", "Precondition failed: UID in precondition")
        pod["metadata"]["annotations"].update(annotations)
        return copy.deepcopy(pod)

    async def post_event(
        self, ref: Mapping[str, Any], type_: str, reason: str, message: str, component: str = "rlsched-operator"
    ) -> None:
        self.events.append({"ref": dict(ref), "type": type_, "reason": reason, "message": message})


def main(argv: list[str] | None = None) -> int:
    """``python -m rlsched.operator.testing extender [flags]``: the extender with fake models."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "extender":
        print("usage: python -m rlsched.operator.testing extender [rlsched extender flags]", file=sys.stderr)
        return 2
    import argparse

    from rlsched.extender import cli as ext_cli
    from rlsched.extender.logs import setup_logging
    from rlsched.extender.server import StartupError, serve
    from rlsched.extender.settings import ConfigError, getenv, load_settings

    parser = argparse.ArgumentParser(prog="rlsched-test-extender")
    ext_cli.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    try:
        settings = load_settings(args.config, getenv(), ext_cli._overrides(args))
    except ConfigError as exc:
        print(f"test extender: {exc}", file=sys.stderr)
        return 2
    setup_logging(settings.log.level, settings.log.format)
    try:
        return asyncio.run(serve(settings, model_loader=fake_model_loader))
    except StartupError as exc:
        print(f"test extender: {exc}", file=sys.stderr)
        return exc.code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
