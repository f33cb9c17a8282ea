"""What filter's decisions keep alive after the answer.

A decision holds arrays over the feasible nodes (their indices, the scores, a card per node: ~24
bytes a node). The decision ring keeps 4,096 records and filter's memory up to 8,192 entries: when
either held on to those arrays, the extender's memory grew by ~0.1–0.2 GB at 1,000 nodes and five
times that at 5,000 (measured with tracemalloc; pods filtered and never bound are never popped from
the memory by a bind)."""

from __future__ import annotations

import asyncio
import gc
import weakref

from rlsched.extender.policy import Outcome
from rlsched.extender.testing import Harness, make_node, make_pod
from rlsched.extender.verbs import DecisionMemory, Remembered
from rlsched.extender.wire import ExtenderArgs

NODES = [make_node(f"g-{i}", gpus=4) for i in range(8)]
NAMES = [n["metadata"]["name"] for n in NODES]


def test_the_ring_record_does_not_keep_the_decision_arrays() -> None:
    h = Harness(NODES)
    pod = make_pod("p", gpu_milli=300, uid="p", scheduler="someone-else")  # filtered, never held nor bound
    answer = asyncio.run(h.extender.filter(ExtenderArgs(pod, NAMES, None)))
    assert len(answer["NodeNames"]) == 1
    decision = h.extender.memory.get("p").outcome.decision
    arrays = [weakref.ref(decision.feasible), weakref.ref(decision.scores.values)]
    del decision
    h.extender.memory.pop("p")
    gc.collect()
    assert all(a() is None for a in arrays)  # nothing else holds them: not the ring's record
    record = h.ring.read(0)["records"][-1]  # and the record still says what was decided
    assert record["node"] == answer["NodeNames"][0] and record["feasible"] == 8
    assert len(record["topScores"]) == 5 and all(s["node"] in NAMES for s in record["topScores"])


def test_the_memory_lets_expired_decisions_go_at_the_next_put() -> None:
    now = [1000.0]
    memory = DecisionMemory(ttl_s=30, clock=lambda: now[0])

    def remembered(at: float) -> Remembered:
        return Remembered(None, 0, Outcome(None, "fallback", "fgd"), at)  # type: ignore[arg-type]

    for i in range(100):
        memory.put(f"old-{i}", remembered(now[0]))
    now[0] += 31
    memory.put("new", remembered(now[0]))
    assert len(memory) == 1 and memory.get("new") is not None
    now[0] += 10
    memory.put("newer", remembered(now[0]))
    assert len(memory) == 2  # not expired yet: kept
