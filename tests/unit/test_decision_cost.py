"""benchmarks/decision_cost.py measures decisions on the throughput benchmark's cluster and pods, read by
the extender's parsers: the node mix and every pod's request must come through as that benchmark made them."""

from __future__ import annotations

from benchmark_scripts import load_benchmark


def test_its_cluster_is_the_throughput_benchmarks_node_mix() -> None:
    state = load_benchmark("decision_cost").bench_cluster(40)
    # 60 % eight-card nodes (three models in turn), 15 % four-card T4, the rest CPU-only; 96 cores, 384 GiB
    assert [int(c) for c in state.gpu_count] == [8] * 24 + [4] * 6 + [0] * 10
    models = [state.model_names[m] if m >= 0 else "" for m in state.model_id]
    assert models == ["V100M16", "V100M32", "A100"] * 8 + ["T4"] * 6 + [""] * 10
    assert set(state.cpu_cap.tolist()) == {96_000} and set(state.mem_cap.tolist()) == {384 * 1024}


def test_its_pods_are_the_throughput_benchmarks_pods() -> None:
    cost, throughput = load_benchmark("decision_cost"), load_benchmark("scheduler_throughput")
    specs, shapes = cost.bench_pods(300, 3), throughput.make_pods(300, 3)
    assert [(s.cpu_milli, s.memory_mib, s.num_gpu, s.gpu_milli) for s in specs] == [
        (p["cpu"], p["mem"], p["gpus"], p["milli"] if p["gpus"] else 0) for p in shapes
    ]
    assert any(0 < s.gpu_milli < 1000 for s in specs)  # shares, given as the annotation, were read
