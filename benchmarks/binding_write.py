#!/usr/bin/env python3
"""The extender's bind write on its own: ``POST pods/binding`` through the extender's API client, at a
fixed rate, on a cluster nothing else is loading.

What it answers: how long the one write of the extender's bind takes when neither the API server nor
the extender is short of CPU — the client-side time (request sent → answer read, the same span as the
extender's ``rlsched_extender_binding_write_seconds``) beside kube-apiserver's own handler
(``apiserver_request_duration_seconds{resource="pods",subresource="binding"}``, from its /metrics
before and after). ``scheduler_throughput.py`` measures the same pair under a full scheduling load;
the two together say whether a slow bind is the bind path or the machine (docs/benchmarks.md, "Bind").

Pods are created with ``schedulerName: nobody`` (no scheduler takes them), bound to the cluster's
nodes in turn, with or without the card annotations the extender puts on its Bindings, and deleted at
the end. Needs a kubeconfig allowed to create pods and bindings (the admin's of
``hack/local-cluster.sh``, which ``hack/local-cluster.sh env`` exports as ``$KUBECONFIG``) and at least
one node::

    hack/local-cluster.sh up --fake-nodes 10
    eval "$(hack/local-cluster.sh env)"
    .venv/bin/python benchmarks/binding_write.py --kubeconfig "$KUBECONFIG" --pods 1000 --rate 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scheduler_throughput import diff, histogram, pct, quantile  # noqa: E402

from rlsched.extender.kubeapi import KubeApi, pod_path  # noqa: E402
from rlsched.extender.objects import assignment_annotations  # noqa: E402
from rlsched.extender.settings import GpuConventions, KubeSettings  # noqa: E402

BINDING = {"resource": "pods", "subresource": "binding", "verb": "POST"}


def summary(client_s: list[float], handler: list[tuple[float, float]]) -> dict[str, Any]:
    """Client p50/p90/p99 (exact, from every sample) and the handler's p50/p99 (interpolated within
    kube-apiserver's coarse buckets) and its count below 5 ms, all in ms."""
    out: dict[str, Any] = {
        "writes": len(client_s),
        "clientP50Ms": round(1000 * pct(client_s, 0.5), 2),
        "clientP90Ms": round(1000 * pct(client_s, 0.9), 2),
        "clientP99Ms": round(1000 * pct(client_s, 0.99), 2),
    }
    p50, p99 = quantile(handler, 0.5), quantile(handler, 0.99)
    out["apiserverP50Ms"] = None if p50 is None else round(1000 * p50, 2)
    out["apiserverP99Ms"] = None if p99 is None else round(1000 * p99, 2)
    out["apiserverUnder5Ms"] = int(next((n for le, n in handler if le == 0.005), 0))
    out["apiserverCount"] = int(handler[-1][1]) if handler else 0
    return out


async def run(a: argparse.Namespace) -> dict[str, Any]:
    api = KubeApi.from_settings(KubeSettings(kubeconfig=a.kubeconfig))
    try:
        nodes = a.node or [n["metadata"]["name"] for n in (await api.request("GET", "/api/v1/nodes"))["items"]]
        if not nodes:
            raise SystemExit("the cluster has no node to bind to")
        prefix = f"bind-probe-{uuid.uuid4().hex[:6]}"
        uids = []
        for i in range(a.pods):
            body = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"{prefix}-{i}", "namespace": a.namespace},
                "spec": {
                    "schedulerName": "nobody",
                    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                },
            }
            uids.append((await api.request("POST", f"/api/v1/namespaces/{a.namespace}/pods", body))["metadata"]["uid"])
        gpu = GpuConventions()
        before = await metrics(api)
        client_s: list[float] = []

        async def bind(i: int) -> None:
            node = nodes[i % len(nodes)]
            ann = assignment_annotations(gpu, node, (0,), 1000) if a.annotations else None
            t = time.perf_counter()
            await api.create_binding(a.namespace, f"{prefix}-{i}", uids[i], node, 10.0, ann)
            client_s.append(time.perf_counter() - t)

        tasks = []
        start = time.perf_counter()
        for i in range(a.pods):
            await asyncio.sleep(max(0.0, start + i / a.rate - time.perf_counter()))
            tasks.append(asyncio.create_task(bind(i)))
        await asyncio.gather(*tasks)
        after = await metrics(api)
        handler = diff(
            histogram(after, "apiserver_request_duration_seconds", BINDING),
            histogram(before, "apiserver_request_duration_seconds", BINDING),
        )
        for i in range(a.pods):
            await api.request("DELETE", pod_path(a.namespace, f"{prefix}-{i}") + "?gracePeriodSeconds=0")
        return {"pods": a.pods, "rate": a.rate, "annotations": a.annotations, **summary(client_s, handler)}
    finally:
        await api.close()


async def metrics(api: KubeApi) -> str:
    """kube-apiserver's /metrics as text (the client parses JSON only, so read it raw)."""
    session = api.session()
    async with session.get(api.host + "/metrics", headers=api._headers()) as resp:  # noqa: SLF001
        return await resp.text()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--kubeconfig", required=True, help="a kubeconfig allowed to create pods and pods/binding")
    p.add_argument("--namespace", default="default")
    p.add_argument("--pods", type=int, default=1000, help="bindings to write (one pod each)")
    p.add_argument("--rate", type=float, default=100.0, help="bindings started per second")
    p.add_argument(
        "--node", action="append", help="bind to this node (repeat for several; default: every node, in turn)"
    )
    p.add_argument(
        "--no-annotations",
        dest="annotations",
        action="store_false",
        help="plain Bindings, without the card annotations the extender adds",
    )
    p.add_argument("--json", type=Path, help="write the result here")
    a = p.parse_args(argv)
    result = asyncio.run(run(a))
    print(json.dumps(result))
    if a.json:
        a.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
