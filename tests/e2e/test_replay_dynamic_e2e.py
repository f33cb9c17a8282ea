"""The real-stack dynamic replay end to end on a tiny slice (hack/replay_dynamic.py, docs/replay.md).

``hack/replay_dynamic.py`` starts a control plane of its own (with Prometheus and kwok's lifetime
stage, ``hack/kwok/pod-lifetime.yaml``), so this test does not use the session ``cluster``. It replays
five simulated minutes of a small synthetic trace on 8 kwok nodes at 6× and checks what only the real
stack can show: every pod of the steady-state start was placed by kube-scheduler through the
extender, kwok deleted pods when their (compressed) lifetimes ended, Prometheus held the exporter's
usage for every node at every tick, and the GPU allocation and rejected pods agree with the simulator
on the same slice within the replay's tolerances. Skipped (saying why) without the control-plane
binaries or Prometheus; missing binaries fail under ``RLSCHED_E2E_REQUIRE=1``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_BIN = Path(os.environ.get("RLSCHED_TOOLS_BIN", REPO_ROOT / ".tools" / "bin"))

NODES = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
    f"replay-node-{i},{32000 if i % 2 else 64000},{131072 if i % 2 else 262144},{4 if i % 2 else 8},"
    f"{'T4' if i % 2 else 'V100M16'}\n"
    for i in range(8)
)
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
)
POD_KINDS = [  # cpu, memory, cards, milli per card, qos, lifetime s
    (8000, 16384, 1, 1000, "LS", 240),
    (16000, 32768, 2, 1000, "BE", 600),
    (4000, 8192, 1, 500, "LS", 120),
    (2000, 4096, 1, 250, "BE", 90),
    (4000, 8192, 0, 0, "BE", 300),
    (6000, 12288, 1, 1000, "Burstable", 420),
]
PODS = POD_HEADER + "".join(
    f"replay-pod-{i},{c},{m},{g},{milli},,{q},Running,0,{life},\n"
    for i, (c, m, g, milli, q, life) in enumerate(POD_KINDS * 4)
)


def test_a_tiny_slice_replays_through_the_real_stack(tmp_path: Path) -> None:
    missing = [
        b
        for b in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
        if not (TOOLS_BIN / b).exists()
    ]
    if missing:
        if os.environ.get("RLSCHED_E2E_REQUIRE") == "1":
            pytest.fail(f"control-plane binaries missing in {TOOLS_BIN}: {missing} (hack/build-tools.sh)")
        pytest.skip(f"control-plane binaries missing in {TOOLS_BIN}: {missing} (hack/build-tools.sh)")
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not installed (hack/install-system-deps.sh): the replay reads usage from it")
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS)
    out = tmp_path / "replay.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLSCHED_") or k == "RLSCHED_TOOLS_BIN"}
    env["PYTHONSAFEPATH"] = "1"
    done = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "hack" / "replay_dynamic.py"),
            *("--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "pods.csv")),
            *("--node-count", "8", "--window", "300", "--compression", "6", "--load", "0.8"),
            *("--tiebreak-seeds", "0", "--json", str(out)),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode in (0, 1), f"replay failed:\n{done.stderr[-4000:]}"
    result = json.loads(out.read_text())
    pods = result["pods"]
    start = [p for p in pods if p["arrivalSimS"] < 0]
    assert start and all(p["bound"] is not None for p in start), "every start pod fits an 8-node cluster at load 0.8"
    assert result["decisions"], "the extender made the decisions"
    # kwok's lifetime stage: the pods that ended did so at their compressed lifetimes (not at once, not never)
    assert result["lifetimes"]["ended"] >= 5
    assert result["lifetimes"]["absErrorSimS"]["p99"] < 60
    assert any(p["deleted"] is None for p in pods), "long-lived pods outlive the window"
    # the exporter's usage reached Prometheus for every node at every tick
    assert result["prometheus"]["missingNodeTicks"] == 0
    rows = {r["metric"]: r for r in result["comparison"]}
    assert rows["mean_allocated_gpu_pct"]["ok"], rows["mean_allocated_gpu_pct"]
    assert rows["rejected"]["ok"], rows["rejected"]
    assert 0 < rows["mean_allocated_gpu_pct"]["real"] <= 100
