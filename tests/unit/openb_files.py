"""Write small node and pod lists as openb CSV files (the living-cluster tests' CLI and trainer inputs)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rlsched.policy import NodeSpec, PodSpec

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
)


def write_openb(folder: Path, nodes: Sequence[NodeSpec], pods: Sequence[PodSpec]) -> tuple[Path, Path]:
    """``folder/nodes.csv`` and ``folder/pods.csv``; returns their paths."""
    node_path = folder / "nodes.csv"
    node_path.write_text(
        NODE_HEADER + "".join(f"{n.name},{n.cpu_milli},{n.memory_mib},{n.gpu_count},{n.gpu_model}\n" for n in nodes)
    )
    pod_path = folder / "pods.csv"
    pod_path.write_text(
        POD_HEADER
        + "".join(
            f"{p.name},{p.cpu_milli},{p.memory_mib},{p.num_gpu},{p.gpu_milli},,{p.qos},Running,"
            f"{p.creation_time:.0f},{p.deletion_time:.0f},\n"
            for p in pods
        )
    )
    return node_path, pod_path
