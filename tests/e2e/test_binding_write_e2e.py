"""benchmarks/binding_write.py on the real API server: it writes the Bindings it says, through the
extender's own client, with the extender's card annotations, and leaves no pod behind."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests" / "unit"))
from benchmark_scripts import load_benchmark  # noqa: E402


def test_binding_write_binds_and_cleans_up(cluster: Any, tmp_path: Path) -> None:
    node = f"bind-probe-e2e-{uuid.uuid4().hex[:6]}"
    manifest = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {"type": "kwok"}}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    try:
        bw = load_benchmark("binding_write")
        out = tmp_path / "bw.json"
        assert (
            bw.main(
                [
                    "--kubeconfig",
                    str(cluster.kubeconfig),
                    "--pods",
                    "20",
                    "--rate",
                    "50",
                    "--node",
                    node,
                    "--json",
                    str(out),
                ]
            )
            == 0
        )
        result = json.loads(out.read_text())
        assert result["writes"] == 20 and result["annotations"] is True
        assert result["apiserverCount"] >= 20  # the API server's own count of POST pods/binding in the window
        assert 0 < result["clientP50Ms"] <= result["clientP99Ms"]
        assert (
            "bind-probe-" not in cluster.kubectl("get", "pods", "-A", "-o", "name").stdout
        )  # deleted at once (grace 0)
    finally:
        cluster.kubectl("delete", "node", node, "--ignore-not-found")
