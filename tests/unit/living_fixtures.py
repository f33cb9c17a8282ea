"""A small living cluster for the dynamic-mode tests: ten nodes of two GPU models, and five pods of the
shapes that matter (whole cards, shares, cpu only; latency-sensitive and best-effort), short-lived."""

from __future__ import annotations

from rlsched.policy import NodeSpec, PodSpec

NODES = [NodeSpec(f"n{i}", 32000, 131072, 4, "V100M16") for i in range(6)] + [
    NodeSpec(f"t{i}", 16000, 65536, 2, "T4") for i in range(4)
]
SHORT_LIVED = [
    PodSpec("w1", 8000, 16384, 1, 1000, (), 0, 900, "LS"),
    PodSpec("w2", 16000, 32768, 2, 1000, (), 0, 2400, "BE"),
    PodSpec("s1", 4000, 8192, 1, 500, (), 0, 600, "LS"),
    PodSpec("s2", 2000, 4096, 1, 250, (), 0, 300, "BE"),
    PodSpec("c1", 4000, 8192, 0, 0, (), 0, 1200, "BE"),
]
