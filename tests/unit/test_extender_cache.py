"""The watch-fed cache: nodes and pods in, a ClusterState out; assignments from annotations."""

from __future__ import annotations

import copy
import warnings

import numpy as np

from rlsched.extender.cache import ASSUMED, BOUND, RETRY_PER_RELEASE, UNCERTAIN, ClusterCache
from rlsched.extender.objects import assignment_annotations, pod_info
from rlsched.extender.settings import GpuConventions
from rlsched.extender.testing import make_node, make_pod

GPU = GpuConventions()


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def cache_with(nodes, pods=(), clock=None) -> ClusterCache:
    c = ClusterCache(GPU, clock=clock or Clock())
    c.replace_nodes(nodes)
    c.replace_pods(list(pods))
    return c


def bound(name, node, cards, milli=1000, gpus=0, **kw):
    ann = assignment_annotations(GPU, node, tuple(cards), milli)
    if milli < 1000:
        return make_pod(name, node=node, gpu_milli=milli, annotations=ann, uid=f"uid-{name}", **kw)
    return make_pod(name, node=node, gpus=gpus or len(cards), annotations=ann, uid=f"uid-{name}", **kw)


def test_ready_after_both_lists() -> None:
    c = ClusterCache(GPU)
    assert not c.ready
    c.replace_nodes([make_node("a")])
    assert not c.ready
    c.replace_pods([])
    assert c.ready and c.state.names == ("a",)


def test_recorded_cards_are_restored() -> None:
    c = cache_with([make_node("g", gpus=4)], [bound("w", "g", (1, 3)), bound("s", "g", (2,), milli=300)])
    s = c.state
    assert s.card_free[0].tolist() == [1000, 0, 700, 0]
    assert c.pods["uid-w"].status == BOUND and c.pods["uid-w"].cards == (1, 3)


def test_pods_without_annotation_get_the_default_rule() -> None:
    c = cache_with([make_node("g", gpus=4)], [make_pod("x", node="g", gpus=2, uid="x")])
    assert c.state.card_free[0].tolist() == [0, 0, 1000, 1000]


def test_conflicting_annotation_falls_back_to_free_cards() -> None:
    c = cache_with([make_node("g", gpus=2)], [bound("a", "g", (0,)), bound("b", "g", (0,))])
    assert c.state.card_free[0].tolist() == [0, 0]
    assert c.pods["uid-b"].cards == (1,)


def test_unplaceable_pod_is_reported_not_counted() -> None:
    c = cache_with([make_node("g", gpus=1)], [bound("a", "g", (0,)), make_pod("b", node="g", gpus=1, uid="b")])
    assert c.state.full_free[0] == 0  # the state is built lazily, at the first read
    assert c.pods["b"].placement is None and "card" in c.pods["b"].problem
    assert c.summary()["unplaceablePods"] == 1


def test_terminal_and_deleted_pods_release() -> None:
    pod = bound("a", "g", (0,))
    c = cache_with([make_node("g", gpus=2)], [pod])
    done = dict(pod, status={"phase": "Succeeded"})
    c.set_pod(done)
    assert c.state.card_free[0].tolist() == [1000, 1000] and "uid-a" not in c.pods
    c.set_pod(pod)
    c.delete_pod("uid-a")
    assert c.state.full_free[0] == 2


def test_node_change_rebuilds_and_keeps_pods() -> None:
    c = cache_with([make_node("g", gpus=2), make_node("h", gpus=2)], [bound("a", "g", (1,))])
    epoch = c.epoch
    c.set_node(make_node("i", gpus=8))
    assert c.state.names == ("g", "h", "i") and c.epoch == epoch + 1
    assert c.state.card_free[c.state.index["g"]].tolist()[:2] == [1000, 0]
    c.set_node(make_node("i", gpus=8, rv="2000"))  # same spec: no rebuild
    assert c.epoch == epoch + 1
    c.delete_node("g")
    assert c.state.names == ("h", "i") and c.pods["uid-a"].placement is None


def test_relist_drops_vanished_pods_but_keeps_our_reservations() -> None:
    clock = Clock()
    c = cache_with([make_node("g", gpus=2)], [bound("a", "g", (0,))], clock)
    spec = c.pods["uid-a"].spec
    c.add("mine", "default/mine", "g", spec, (1,), ASSUMED)
    c.replace_pods([])
    assert "uid-a" not in c.pods and "mine" in c.pods
    assert c.state.card_free[0].tolist() == [1000, 0]


def test_watch_confirms_an_assumed_pod_without_double_counting() -> None:
    c = cache_with([make_node("g", gpus=2)])
    pod = bound("a", "g", (1,))
    info = pod_info(pod, GPU)
    c.add(info.uid, info.key, "g", info.spec, (1,), ASSUMED)
    pending = make_pod("a", gpus=1, uid="uid-a")  # the watch still shows it pending: keep the reservation
    c.set_pod(pending)
    assert c.pods["uid-a"].status == ASSUMED
    c.set_pod(pod)
    assert c.pods["uid-a"].status == BOUND and c.state.card_free[0].tolist() == [1000, 0]


def test_a_running_pod_on_a_node_of_another_gpu_model_is_counted() -> None:
    """Bound by a scheduler that ignores the model annotation (or its node relabelled): the model
    check left it uncounted, and its two cards went to the next pod."""
    pod = bound("a", "g", (0, 1), gpu_models="A100", scheduler="default-scheduler")
    c = cache_with([make_node("g", gpus=2, model="V100M16")], [pod])
    assert c.pods["uid-a"].placement is not None and c.state.full_free[0] == 0
    c.set_node(make_node("g", gpus=2, model="T4", rv="2"))  # relabelled: rebuilt
    assert c.state.full_free[0] == 0 and c.pods["uid-a"].placement is not None


def test_our_bound_pod_stays_counted_across_a_rebuild_and_the_watch() -> None:
    """Our bind had written the binding (ASSUMED, bind_done) when the node's allocatable shrank: the
    rebuild could not fit it without overcommit, and the watch's confirmation never placed it again,
    so its card read as free."""
    c = cache_with([make_node("g", cpu="8", gpus=1)])
    pod = bound("a", "g", (0,), cpu="8")
    info = pod_info(pod, GPU)
    entry = c.add(info.uid, info.key, "g", info.spec, (0,), ASSUMED)
    entry.bind_done = True
    c.set_node(make_node("g", cpu="7900m", gpus=1, rv="2"))
    assert c.state.full_free[0] == 0 and c.pods["uid-a"].placement is not None
    c.set_pod(pod)
    assert c.pods["uid-a"].status == BOUND and c.pods["uid-a"].placement is not None
    assert c.state.full_free[0] == 0 and int(c.state.cpu_free[0]) == -100


def test_the_watch_counts_an_unplaced_assumed_pod_when_it_confirms_it() -> None:
    c = cache_with([make_node("g", cpu="8", gpus=1)])
    pod = bound("a", "g", (0,), cpu="8")
    info = pod_info(pod, GPU)
    c.add(info.uid, info.key, "g", info.spec, (0,), ASSUMED)  # bind in flight
    c.set_node(make_node("g", cpu="7900m", gpus=1, rv="2"))  # not running yet: not overcommitted
    assert c.state.full_free[0] == 1 and c.pods["uid-a"].placement is None
    c.set_pod(pod)  # it runs there
    assert c.pods["uid-a"].status == BOUND and c.pods["uid-a"].placement is not None
    assert c.state.full_free[0] == 0


def test_uncertain_reservations_expire() -> None:
    clock = Clock()
    c = cache_with([make_node("g", gpus=1)], clock=clock)
    info = pod_info(make_pod("a", gpus=1, uid="a"), GPU)
    e = c.add("a", info.key, "g", info.spec, (0,), UNCERTAIN)
    assert e.placement is not None
    clock.t += 10
    assert c.expire_uncertain(30) == []
    clock.t += 30
    assert c.expire_uncertain(30) == ["a"] and c.state.full_free[0] == 1


def test_resized_pod_is_replaced() -> None:
    pod = make_pod("a", cpu="4", node="g", uid="a")
    c = cache_with([make_node("g", cpu="10")], [pod])
    assert c.state.cpu_free[0] == 6000
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "6"
    c.set_pod(pod)
    assert c.state.cpu_free[0] == 4000


def test_load_rows_bump_versions_only_when_changed() -> None:
    c = cache_with([make_node("a"), make_node("b")])
    v = c.state.node_version.copy()
    c.set_load({"a": np.array([0.5, 0.25, np.nan, 0.1])})
    assert c.state.load[0, 0] == 0.5 and np.isnan(c.state.load[1]).all()
    assert (c.state.node_version - v).tolist() == [1, 0]
    c.set_load({"a": np.array([0.5, 0.25, np.nan, 0.1])})
    assert (c.state.node_version - v).tolist() == [1, 0]
    c.set_node(make_node("c"))  # a rebuild keeps the load
    assert c.state.load[c.state.index["a"], 1] == 0.25


def test_unreadable_objects_are_skipped_and_counted() -> None:
    c = cache_with([make_node("a")])
    bad = make_node("b")
    bad["status"]["allocatable"]["cpu"] = "many"
    c.set_node(bad)
    c.set_pod({"metadata": {"name": 3}})
    assert c.stats.node_errors == 1 and c.stats.pod_errors == 1 and list(c.nodes) == ["a"]


def test_no_nodes_means_no_state() -> None:
    c = cache_with([])
    assert c.state is None and c.summary()["nodes"] == 0


def test_rebuild_carries_unchanged_nodes_over_exactly() -> None:
    """After node churn, the carried-over state equals one built from scratch with the same pods."""
    rng = np.random.default_rng(3)
    nodes = [make_node(f"n{i:02d}", gpus=int(rng.choice([0, 2, 4, 8]))) for i in range(20)]
    pods = []
    for i in range(60):
        n = nodes[int(rng.integers(len(nodes)))]
        gpus = int(n["status"]["allocatable"].get("nvidia.com/gpu", 0))
        kind = rng.integers(3) if gpus else 0
        kw = {0: {}, 1: {"gpus": 1}, 2: {"gpu_milli": int(rng.choice([200, 500]))}}[int(kind)]
        pods.append(make_pod(f"p{i}", cpu="1", memory="1Gi", node=n["metadata"]["name"], uid=f"p{i}", **kw))
    c = cache_with(nodes, pods)
    c.state  # noqa: B018
    for step in range(30):
        op = step % 4
        if op == 0:
            c.set_node(make_node(f"x{step}", gpus=int(rng.choice([0, 4, 16]))))
        elif op == 1 and c.nodes:
            c.delete_node(sorted(c.nodes)[int(rng.integers(len(c.nodes)))])
        elif op == 2:
            name = sorted(c.nodes)[int(rng.integers(len(c.nodes)))]
            c.set_node(make_node(name, cpu="200", gpus=8))  # changed capacity: its pods are placed again
        else:
            for uid in list(c.pods)[:3]:
                c.forget(uid)
        if step % 3 == 0:
            c.state  # noqa: B018 - rebuild now and then, with forgets in between
    got = c.state
    fresh = ClusterCache(GPU)
    fresh.nodes = dict(c.nodes)
    for e in sorted(c.pods.values(), key=lambda e: e.uid):
        fresh.pods[e.uid] = type(e)(e.uid, e.key, e.node, e.spec, e.cards, e.status, e.since)
    want = fresh.state
    for attr in (
        "cpu_free",
        "mem_free",
        "card_free",
        "full_free",
        "max_card_free",
        "kind_count",
        "gpu_pods",
        "nonzero_cpu_used",
        "nonzero_mem_used_bytes",
    ):
        np.testing.assert_array_equal(getattr(got, attr), getattr(want, attr), err_msg=attr)
    assert {u: e.placement is None for u, e in c.pods.items()} == {
        u: e.placement is None for u, e in fresh.pods.items()
    }


def test_status_only_pod_updates_skip_parsing_but_keep_the_version(monkeypatch) -> None:
    import rlsched.extender.cache as cache_module

    c = cache_with([make_node("g", gpus=2)])
    pending = make_pod("p", gpus=1, uid="p", rv="10")
    running = make_pod("r", gpus=1, uid="r", node="g", rv="11")
    c.set_pod(pending)
    c.set_pod(running)
    calls = []
    real = cache_module.pod_info
    monkeypatch.setattr(cache_module, "pod_info", lambda *a, **k: calls.append(1) or real(*a, **k))
    pending2 = {**pending, "metadata": {**pending["metadata"], "resourceVersion": "12"}}
    pending2["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False"}],
        "qosClass": "Guaranteed",  # set at creation, never changed
    }
    c.set_pod(pending2)  # kube-scheduler's condition: nothing the cache reads
    running2 = {**running, "metadata": {**running["metadata"], "resourceVersion": "13"}}
    running2["status"] = {"phase": "Running", "podIP": "10.0.0.1", "qosClass": "Guaranteed"}  # kwok's Pending → Running
    c.set_pod(running2)
    assert calls == [] and c.pending["p"].resource_version == "12" and c.state.full_free[0] == 1
    resized = {**pending2, "metadata": {**pending2["metadata"], "resourceVersion": "14"}}
    resized["spec"] = {**pending["spec"], "schedulerName": "other"}
    c.set_pod(resized)  # a change of what is read: parsed again
    assert calls == [1] and c.pending["p"].scheduler_name == "other"
    done = {**running2, "status": {"phase": "Succeeded"}}
    c.set_pod(done)  # terminal: released
    assert calls == [1, 1] and "r" not in c.pods and c.state.full_free[0] == 2


def test_node_heartbeats_skip_parsing_label_changes_do_not(monkeypatch) -> None:
    import rlsched.extender.cache as cache_module

    node = make_node("g", gpus=2, model="T4")
    c = cache_with([node])
    calls = []
    real = cache_module.node_spec
    monkeypatch.setattr(cache_module, "node_spec", lambda *a, **k: calls.append(1) or real(*a, **k))
    beat = {**node, "status": {**node["status"], "conditions": [{"type": "Ready", "lastHeartbeatTime": "now"}]}}
    c.set_node(beat)
    assert calls == []
    relabelled = {**beat, "metadata": {**beat["metadata"], "labels": {**beat["metadata"]["labels"], "zone": "b"}}}
    c.set_node(relabelled)
    assert calls == [1] and c.node_facts["g"].labels["zone"] == "b"
    c.delete_node("g")
    c.set_node(beat)  # back after a delete: read in full
    assert calls == [1, 1] and "g" in c.nodes


def test_latency_sensitive_pods_are_counted_per_node_and_survive_a_rebuild() -> None:
    """What a model trained with the QoS features reads (state.pods, state.ls_pods): the pods' QoS label
    (Koordinator's koordinator.sh/qosClass), counted as they come, go, and across a node-list rebuild."""
    ls = bound("ls", "g", (0,))
    ls["metadata"]["labels"] = {GPU.qos_label: "LS"}
    be = bound("be", "g", (1,))
    be["metadata"]["labels"] = {GPU.qos_label: "BE"}
    c = cache_with([make_node("g", gpus=2), make_node("h", gpus=2)], [ls, be])
    g = c.state.index["g"]
    assert c.state.pods[g] == 2 and c.state.ls_pods[g] == 1
    c.set_node(make_node("i", gpus=8))  # a rebuild: node g is carried over with its counts
    g = c.state.index["g"]
    assert c.state.pods[g] == 2 and c.state.ls_pods[g] == 1
    c.delete_pod("uid-ls")
    assert c.state.pods[g] == 1 and c.state.ls_pods[g] == 0


def test_a_label_change_alone_updates_the_pods_class() -> None:
    """Labels are part of what the cache reads (the class): a change of labels alone is not skipped
    as a no-op update, for a bound pod (the node's count) or a pending one (its class)."""
    pod = bound("a", "g", (0,))
    pod["metadata"]["labels"] = {GPU.latency_sensitive_label: "false"}  # its Kubernetes class is Guaranteed
    c = cache_with([make_node("g", gpus=2)], [pod])
    assert c.state.ls_pods[0] == 0
    relabelled = copy.deepcopy(pod)
    relabelled["metadata"]["labels"] = {GPU.latency_sensitive_label: "true"}
    relabelled["metadata"]["resourceVersion"] = "2001"
    c.set_pod(relabelled)
    assert c.state.pods[0] == 1 and c.state.ls_pods[0] == 1
    pending = make_pod("p", uid="p", scheduler="rl-scheduler")
    pending["status"].pop("qosClass")
    c.set_pod(pending)
    assert c.pending["p"].spec is not None and c.pending["p"].spec.qos == ""
    again = copy.deepcopy(pending)
    again["metadata"]["labels"] = {GPU.qos_label: "LS"}
    again["metadata"]["resourceVersion"] = "2002"
    c.set_pod(again)
    info = c.pending["p"]
    assert info.spec is not None and info.spec.qos == "LS"


def test_running_pods_that_overfill_a_node_in_mib_are_all_counted_with_their_cards() -> None:
    """kube-scheduler compares bytes; the state holds MiB (pods rounded up, nodes down). Three running
    pods that fill a node exactly in bytes overfill it in MiB: all are counted, none of their cards free."""
    ki = 15_928_356
    node = make_node("n", cpu="32", memory=f"{ki}Ki", gpus=4)
    rest = ki * 1024 - 300_000_000
    pods = [
        make_pod("ds1", cpu="100m", memory="200M", node="n", uid="ds1", scheduler="default-scheduler"),
        make_pod("ds2", cpu="100m", memory="100M", node="n", uid="ds2", scheduler="default-scheduler"),
        make_pod("train", cpu="8", memory=str(rest), gpus=4, node="n", uid="train", scheduler="default-scheduler"),
    ]
    c = cache_with([node], pods)
    assert all(c.pods[u].placement is not None for u in ("ds1", "ds2", "train"))
    state = c.state
    assert state is not None
    i = state.index["n"]
    assert int(state.full_free[i]) == 0 and int(state.card_free[i].sum()) == 0
    assert int(state.mem_free[i]) < 0  # overcommitted in our view, by the rounding


def test_a_pod_asking_no_cpu_or_memory_still_fits_an_overcommitted_node() -> None:
    """kube-scheduler's fit check skips a request of 0: a node overfilled in our MiB view still takes it."""
    from rlsched.policy import feasible_mask
    from rlsched.policy.feasibility import fits_on, infeasibility_reason

    ki = 15_928_356
    node = make_node("n", cpu="32", memory=f"{ki}Ki", gpus=4)
    pods = [
        make_pod("ds1", cpu="100m", memory="200M", node="n", uid="ds1", scheduler="default-scheduler"),
        make_pod("fill", cpu="1", memory=str(ki * 1024 - 200_000_000), node="n", uid="fill", scheduler="x"),
    ]
    c = cache_with([node], pods)
    state = c.state
    assert state is not None and int(state.mem_free[0]) < 0
    req = state.request(pod_info(make_pod("be", cpu="1", memory="0"), GPU).spec)
    assert feasible_mask(state, req)[0] and fits_on(state, req, 0) and infeasibility_reason(state, req, 0) == ""
    state.place(req, 0, ())  # and it can be placed there
    short = state.request(pod_info(make_pod("m", cpu="1", memory="1Mi"), GPU).spec)
    assert not feasible_mask(state, short)[0] and "insufficient memory" in infeasibility_reason(state, short, 0)


def test_a_relist_in_slices_pauses_between_slices_and_ends_as_one_list_would() -> None:
    """The informer serves requests at each pause; in between, the pods not applied yet keep their
    old versions, and what the list no longer has goes only at the end."""
    nodes = [make_node(f"n{i}", gpus=2) for i in range(5)]
    old = [bound(f"p{i}", f"n{i}", (0,)) for i in range(5)] + [bound("gone", "n0", (1,))]
    new = [bound(f"p{i}", f"n{i}", (0,)) for i in range(5)] + [bound(f"q{i}", f"n{i}", (1,)) for i in range(1, 4)]
    whole = cache_with(nodes, old)
    whole.replace_pods(new)
    sliced = cache_with(nodes, old)
    seen = [sorted(sliced.pods) for _ in sliced.replace_pods_in_slices(new, size=3)]
    olds = ["uid-gone", "uid-p0", "uid-p1", "uid-p2", "uid-p3", "uid-p4"]
    assert seen == [olds, sorted([*olds, "uid-q1"])]
    assert sorted(sliced.pods) == sorted(whole.pods) == sorted(["uid-q1", "uid-q2", "uid-q3", *olds[1:]])
    assert {u: e.cards for u, e in sliced.pods.items()} == {u: e.cards for u, e in whole.pods.items()}
    assert sliced.state.card_free.tolist() == whole.state.card_free.tolist()

    pauses = list(sliced.replace_nodes_in_slices([*nodes[:4], make_node("n9", gpus=2)], size=2))
    assert len(pauses) == 2 and sorted(sliced.nodes) == ["n0", "n1", "n2", "n3", "n9"]


def test_pods_pinned_past_what_a_node_can_count_wait_and_are_counted_as_room_frees() -> None:
    """Running pods are counted whatever they ask; 1,024 asking for the most memory a request reads
    as (8 PiB) wrapped the node's int64 totals round (it read as nearly empty). Past 2**62 a pod waits
    uncounted, and is counted when a counted one leaves; all gone, the node is as it was."""
    c = cache_with([make_node("a"), make_node("b")])
    before = c.state.mem_free.tolist(), c.state.nonzero_mem_used_bytes.tolist()
    pods = [make_pod(f"h{i}", node="a", memory="9Ei", uid=f"h{i}") for i in range(600)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an int64 overflow warns
        for pod in pods:
            c.set_pod(pod)
        s = c.state
        assert c.stats.unplaceable == 600 - 512 and s.mem_free[1] == before[0][1]
        assert -(2**62) <= int(s.mem_free[0]) * (1 << 20) < 0 < int(s.nonzero_mem_used_bytes[0]) <= 2**62
        counted = [p["metadata"]["uid"] for p in pods if c.pods[p["metadata"]["uid"]].placement is not None]
        for uid in counted[:100]:  # each one that leaves makes room for one that waited
            c.delete_pod(uid)
        assert sum(e.placement is not None for e in c.pods.values()) == 500
        for uid in list(c.pods):
            c.delete_pod(uid)
    assert (c.state.mem_free.tolist(), c.state.nonzero_mem_used_bytes.tolist()) == before


def test_a_release_tries_a_bounded_number_of_uncounted_pods_and_the_sweep_the_rest(monkeypatch) -> None:
    """Each release tried every uncounted pod of its node: quadratic in a flood of pods pinned to one
    node (5,000 took 27 s to delete). Now the first RETRY_PER_RELEASE; the periodic sweep tries the rest."""
    two_cards = [make_pod(f"w{i}", node="g", gpus=2, uid=f"w{i}") for i in range(RETRY_PER_RELEASE + 6)]
    one_card = make_pod("x", node="g", gpus=1, uid="x")
    c = cache_with([make_node("g", gpus=2)], [bound("p", "g", (0,)), bound("q", "g", (1,)), *two_cards, one_card])
    assert c.state is not None and c.pods["x"].placement is None
    tries = []
    place_again = ClusterCache._place_again
    monkeypatch.setattr(ClusterCache, "_place_again", lambda self, e: tries.append(e.uid) or place_again(self, e))
    c.delete_pod("uid-p")  # card 0 is free: x fits, the two-card pods do not
    assert len(tries) <= RETRY_PER_RELEASE
    c.retry_unplaced()
    assert c.pods["x"].placement is not None and c.pods["x"].cards == (0,)
    assert all(c.pods[p["metadata"]["uid"]].placement is None for p in two_cards)
    tries.clear()
    c.retry_unplaced()  # nothing left to sweep until a release leaves some untried again
    assert tries == []


def test_a_running_pod_that_does_not_fit_releases_the_holds_of_its_node_only(monkeypatch) -> None:
    """Filter's holds on the node make room for a running pod that did not fit (their binds check
    afresh); holds elsewhere stay. They are found among that node's holds: each pod pinned to a full
    node scanned every pod, then every hold of the cluster (5,000 holds and 5,000 pinned pods: 8 s)."""
    c = cache_with([make_node("g", gpus=2), make_node("h", gpus=2)])
    for i, node in enumerate(["g", "g", "h", "h"]):
        pod = make_pod(f"held{i}", gpus=1, uid=f"held{i}", scheduler="rl-scheduler")
        c.set_pod(pod)
        assert c.reserve(pod_info(pod, GPU), node, (i % 2,))
    looked_up: list[str] = []

    class Pods(dict):  # the cache's pods, noting every UID looked up, and any scan of them all
        def get(self, uid, default=None):
            looked_up.append(uid)
            return super().get(uid, default)

        def items(self):
            looked_up.append("a scan of every pod")
            return super().items()

        values = __iter__ = items  # type: ignore[assignment]

    monkeypatch.setattr(c, "pods", Pods(c.pods))
    c.set_pod(make_pod("runs", node="g", gpus=2, uid="runs"))  # needs both of g's cards: g's holds go
    assert c.pods["runs"].placement is not None and c.state.card_free[0].tolist() == [0, 0]
    assert {u for u in ("held0", "held1", "held2", "held3") if u in c.pods} == {"held2", "held3"}
    assert not {"held2", "held3", "a scan of every pod"} & set(looked_up)  # h's holds were not looked at


def test_a_rebuild_does_not_log_or_count_again_the_pods_that_did_not_fit() -> None:
    """Each rebuild (any node added or changed) placed the uncounted pods again, logged each again and
    counted it again as unplaceable: 88 flooded pods read as 176, 264, 352."""
    c = cache_with([make_node("a"), make_node("b")])
    for i in range(600):
        c.set_pod(make_pod(f"h{i}", node="a", memory="9Ei", uid=f"h{i}"))
    assert c.state is not None and c.stats.unplaceable == 88
    for i in range(3):
        c.set_node(make_node(f"new{i}"))
        assert c.state is not None and c.stats.unplaceable == 88
    assert sum(e.placement is None for e in c.pods.values()) == 88
    pending = make_pod("late", node="a", uid="late")  # listed before a rebuild, never tried: still counted
    c.set_node(make_node("new3"))
    c.set_pod(pending)
    assert c.state is not None and c.stats.unplaceable == 89
