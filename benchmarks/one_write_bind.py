#!/usr/bin/env python3
"""Experiment: ``rlsched extender`` with bind as ONE API write (the Binding carries the annotations).

Not the shipped behaviour — a measurement aid for docs/benchmarks.md. The extender's bind today makes
two writes per pod: a merge-patch of ``rlsched.io/gpu-cards`` / ``-card-milli`` / ``-node`` on the pod,
then ``POST pods/binding``. kube-apiserver copies a Binding's ``metadata.annotations`` onto the pod in
the same update that sets ``spec.nodeName`` (``BindingREST.Create`` → ``assignPod``; checked against
v1.37.2 here: the annotations and the node land together), so one write does both, atomically — the
assignment is still on the pod before any kubelet sees it, half the API writes, and no
"annotated but not bound" state after a failure.

This wrapper patches that in at run time (no file changes) and then runs the normal CLI::

    RLSCHED_STACK_EXTENDER_LAUNCHER=".venv/bin/python benchmarks/one_write_bind.py" \\
        .venv/bin/python benchmarks/scheduler_throughput.py ...

``hack/rlstack.py`` starts the extender with ``$RLSCHED_STACK_EXTENDER_LAUNCHER extender ...``.
"""
from __future__ import annotations

import sys
from typing import Any, Mapping
from urllib.parse import quote

from rlsched.extender import kubeapi

_pending: dict[tuple[str, str, str], dict[str, str]] = {}


async def _patch_pod_annotations(self: Any, namespace: str, name: str, uid: str, annotations: Mapping[str, str],
                                 timeout: float) -> dict:
    """Instead of writing: remember the annotations for the binding that follows."""
    _pending[(namespace, name, uid)] = dict(annotations)
    return {}


async def _create_binding(self: Any, namespace: str, name: str, uid: str, node: str, timeout: float) -> None:
    annotations = _pending.pop((namespace, name, uid), None)
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
    if annotations:
        meta["annotations"] = annotations
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    await self.request("POST", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}/binding", body,
                       timeout=timeout)


kubeapi.KubeApi.patch_pod_annotations = _patch_pod_annotations  # type: ignore[method-assign]
kubeapi.KubeApi.create_binding = _create_binding  # type: ignore[method-assign]

if __name__ == "__main__":
    from rlsched.cli import main

    sys.exit(main(sys.argv[1:]))
