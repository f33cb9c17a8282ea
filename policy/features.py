"""The observation encoding shared by training, the gym environment and serving.

For one pod and its feasible nodes, :meth:`FeatureEncoder.encode` returns one feature row per
*group* of interchangeable nodes. Two nodes are interchangeable when everything the encoder reads
about them is equal (capacity, model, price, free cpu and memory, the multiset of free milli per
card, load): their rows, their scores and the state after placing the pod there are the same up to
renaming nodes. On openb a pod has ~600 feasible nodes but only ~50 groups, so grouping makes
training storage and inference an order of magnitude cheaper without changing the policy.

Every row is ``[pod | node now | after placing | fragmentation | cost and load | QoS | cluster]`` (see
:data:`FEATURES`, in order); all values are scaled to roughly 0..1 by fixed constants, so one model
serves clusters of any size. The prior the network adds its correction to is FGD-CPU's
fragmentation change (:mod:`rlsched.policy.scorers.fgd_cpu`), and the card a share pod gets on a
node is FGD-CPU's card.

Bump :data:`FEATURE_VERSION` whenever a feature's meaning, order or scaling changes: model files
record the schema they were trained with, and the loader refuses a mismatch — except a v1 model,
which :func:`rlsched.policy.export.read_model` upgrades exactly (v2 only added the QoS columns, and
a v1 network reads them with zero weights).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from .cards import default_cards
from .cluster import LOAD_METRICS, ClusterState, PodRequest
from .fragmentation import Fragmentation, for_models, numpy_kernel
from .resources import MILLI_PER_CARD
from .scorers.fgd_cpu import DEFAULT_CPU_WEIGHT, CpuFragmentation
from .typical import TypicalPods

FEATURE_VERSION = 2
"""Version of the feature schema below (v2 added :data:`QOS_FEATURES`)."""

MAX_CPU = 128_000.0
"""cpu scale (millicores): the largest node spec in the FGD simulator."""
MAX_MEM = 1_048_576.0
"""memory scale (MiB): 1 TiB, the largest openb node."""
MAX_GPU = 8_000.0
"""GPU scale (milli): eight cards."""
CARD_SLOTS = 8
"""Free milli of the fullest ``CARD_SLOTS`` cards appear one by one (sorted, most free first);
cards beyond that only count in the totals."""
CPU_PER_CARD = 32_000.0
"""Scale of "cpu per free card" (millicores): whole-card pods ask a median 11.4 cores."""
MEM_PER_CARD = 131_072.0
"""Scale of "memory per free card" (MiB)."""
PER_CARD_CAP = 4.0
"""Cap on the per-free-card features (nodes with no free card get this value)."""
QOS_POD_CAP = 8
"""Pod counts per node (``node_ls_pods``, ``node_other_pods``) are capped here and divided by it."""

POD_FEATURES = (
    "pod_cpu",
    "pod_mem",
    "pod_num_gpu",
    "pod_gpu_milli",
    "pod_gpu_total",
    "pod_is_share",
    "pod_is_whole",
    "pod_is_cpu_only",
    "pod_constrained",
)
NODE_FEATURES = (
    "cpu_free",
    "cpu_free_frac",
    "mem_free",
    "mem_free_frac",
    "gpu_count",
    "full_free",
    "gpu_free_total",
    *(f"card_free_{i}" for i in range(CARD_SLOTS)),
    "cpu_per_free_card",
    "mem_per_free_card",
)
AFTER_FEATURES = (
    "cpu_left",
    "cpu_left_frac",
    "mem_left_frac",
    "gpu_left_total",
    "full_free_after",
    "card_left",
    "cpu_per_free_card_after",
    "mem_per_free_card_after",
    "bestfit_left",
)
FRAG_FEATURES = ("fgd_delta", "fgd_best_delta", "fgd_score", "fgdcpu_delta", "frag_before", "fragcpu_before")
COST_FEATURES = ("price_rel", "load_cpu", "load_mem", "load_known")
QOS_FEATURES = ("pod_latency_sensitive", "node_ls_pods", "node_other_pods")
"""Whether the pod is latency-sensitive, and how many latency-sensitive and other pods the node runs
(capped at :data:`QOS_POD_CAP`). Zero for a model trained without them (``use_qos`` False)."""
CLUSTER_FEATURES = (
    "cluster_gpu_alloc",
    "cluster_full_free",
    "cluster_frag",
    "cluster_cpu_free",
    "feasible_frac",
    "groups_frac",
)
FEATURES: tuple[str, ...] = (
    *POD_FEATURES,
    *NODE_FEATURES,
    *AFTER_FEATURES,
    *FRAG_FEATURES,
    *COST_FEATURES,
    *QOS_FEATURES,
    *CLUSTER_FEATURES,
)
"""Column names of a feature row, in order."""
FEATURES_V1: tuple[str, ...] = tuple(name for name in FEATURES if name not in QOS_FEATURES)
"""The v1 schema: the same columns, in the same order, without :data:`QOS_FEATURES`."""
NUM_FEATURES = len(FEATURES)
CLUSTER_SLICE = slice(NUM_FEATURES - len(CLUSTER_FEATURES), NUM_FEATURES)
"""The cluster-level columns (the same in every row of one pod); the value head reads them."""
PRIOR_SCALE_MILLI = 1000.0
"""The prior (FGD-CPU's Frag_before − Frag_after) is given to the network in cards (milli / 1000)."""


def _columns(first: str, last: str) -> slice:
    return slice(FEATURES.index(first), FEATURES.index(last) + 1)


_POD = _columns(POD_FEATURES[0], POD_FEATURES[-1])
_NODE_AND_AFTER = _columns(NODE_FEATURES[0], AFTER_FEATURES[-1])  # written by _node_columns, in this order
assert FEATURES[_NODE_AND_AFTER] == (*NODE_FEATURES, *AFTER_FEATURES)
_FRAG = _columns(FRAG_FEATURES[0], FRAG_FEATURES[-1])
_PRICE = FEATURES.index("price_rel")
_LOAD = _columns("load_cpu", "load_known")
_QOS = _columns(QOS_FEATURES[0], QOS_FEATURES[-1])
_READ_LOAD = slice(LOAD_METRICS.index("cpu"), LOAD_METRICS.index("memory") + 1)
"""The :attr:`ClusterState.load` columns the encoder reads (``load_cpu``, ``load_mem``, ``load_known``),
the only ones training fills (:mod:`rlsched.policy.dynamic.scrape`). Nodes are grouped on these alone:
network or disk load, which no row shows, must not split a group (``groups_frac``) nor switch the
load columns on."""
assert LOAD_METRICS.index("memory") == LOAD_METRICS.index("cpu") + 1


@dataclass
class Candidates:
    """One pod's feasible nodes, grouped into interchangeable nodes, with a feature row per group."""

    nodes: np.ndarray
    """int64[K]: the feasible nodes, as given."""
    group: np.ndarray
    """int64[K]: group index of each node."""
    rep: np.ndarray
    """int64[G]: position (into ``nodes``) of each group's representative (its lowest node index)."""
    count: np.ndarray
    """int64[G]: nodes per group."""
    features: np.ndarray
    """float32[G, NUM_FEATURES]."""
    prior: np.ndarray
    """float64[G]: FGD-CPU's fragmentation change for the pod on the group's nodes, in cards."""
    card_free: np.ndarray
    """int64[G]: for a share pod, the free milli (before placing) of the card FGD-CPU picks on the
    group's nodes; -1 for other pods. :meth:`FeatureEncoder.node_cards` turns it into card ids."""

    @property
    def num_groups(self) -> int:
        return len(self.rep)


class FeatureEncoder:
    """Builds :class:`Candidates` for a pod; one per typical-pod distribution (FGD's workload model)."""

    def __init__(
        self,
        typical: TypicalPods,
        cpu_weight: float = DEFAULT_CPU_WEIGHT,
        use_load: bool = True,
        use_qos: bool = False,
    ):
        self.typical = typical
        self.cpu_weight = float(cpu_weight)
        self.use_load = use_load
        """Read ``state.load``. False for a model trained where load was never known (the FGD protocol):
        it then sees load as unknown, as in training, wherever it serves."""
        self.use_qos = use_qos
        """Fill :data:`QOS_FEATURES` (and tell nodes apart by their pod counts). False for a model
        trained without them (every v1 model): the columns stay 0, as its network was trained."""
        self._frag: dict[tuple[str, ...], tuple[Fragmentation, CpuFragmentation]] = {}

    def measures(self, state: ClusterState) -> tuple[Fragmentation, CpuFragmentation]:
        """FGD's fragmentation and FGD-CPU's for this cluster's GPU models."""
        return for_models(
            self._frag,
            state.model_names,
            lambda: (
                Fragmentation(self.typical, state.model_names),
                CpuFragmentation(self.typical, state.model_names, self.cpu_weight),
            ),
        )

    def group(self, state: ClusterState, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
        """(rep positions, group per node, count per group, any cpu or memory load known) for ``nodes``."""
        keys = node_keys(state)[nodes]
        if self.use_qos:
            keys = _with_counts(keys, state, nodes)
        load = state.load[:, _READ_LOAD]
        load_known = self.use_load and not np.isnan(load).all()
        if load_known:
            return (*_factorize(keys, np.nan_to_num(load[nodes], nan=-1.0)), load_known)
        return (*_factorize(keys), load_known)

    def encode(self, state: ClusterState, req: PodRequest, nodes: np.ndarray) -> Candidates:
        """Feature rows for ``req`` on the feasible ``nodes`` (indices, ascending; at least one)."""
        nodes = np.asarray(nodes, dtype=np.int64)
        rep, group, count, load_known = self.group(state, nodes)
        n = nodes[rep]
        g = len(n)
        fgd, fgdcpu = self.measures(state)
        pf = fgd.placement(state, req, n)
        _, cpu_card, cpu_delta = fgdcpu.placement(state, req, n)
        x = np.empty((g, NUM_FEATURES), dtype=np.float32)
        # pod
        x[:, _POD] = pod_columns(req)
        # node now, and after placing the pod (a share pod on FGD-CPU's card)
        card_free = np.full(g, -1, dtype=np.int64)
        _node_columns(
            state.cpu_cap[n],
            state.mem_cap[n],
            state.cpu_free[n],
            state.mem_free[n],
            state.card_free[n],
            state.full_free[n],
            state.gpu_count[n],
            req.cpu_milli,
            req.memory_mib,
            req.gpu_total,
            req.gpu_milli if req.is_gpu else 0,
            req.num_gpu,
            req.is_share,
            cpu_card,
            x,
            _NODE_AND_AFTER.start,
            card_free,
        )
        # fragmentation (FGD and FGD-CPU), in cards; the placements above brought both caches up to date
        frag_now = fgd.node_frag(state)
        cols = [
            pf.delta / PRIOR_SCALE_MILLI,
            pf.best_delta / PRIOR_SCALE_MILLI,
            pf.score / 100.0,
            cpu_delta / PRIOR_SCALE_MILLI,
            frag_now[n] / PRIOR_SCALE_MILLI,
            fgdcpu.node_frag(state)[n] / PRIOR_SCALE_MILLI,
        ]
        _write(x, _FRAG, cols)
        # cost and load
        mean_price = _capacity(state)[2]
        x[:, _PRICE] = state.price[n] / mean_price if mean_price > 0 else 1.0
        if load_known:
            load = state.load[n]
            x[:, _LOAD] = np.column_stack(
                [np.nan_to_num(load[:, 0]), np.nan_to_num(load[:, 1]), (~np.isnan(load[:, 0])).astype(np.float64)]
            )
        else:
            x[:, _LOAD] = 0.0
        if self.use_qos:
            _write(x, _QOS, qos_columns(req.latency_sensitive, state.ls_pods[n], state.pods[n]))
        else:
            x[:, _QOS] = 0.0
        x[:, CLUSTER_SLICE] = self._cluster_columns(state, len(nodes), g, float(frag_now.sum()))
        return Candidates(
            nodes=nodes,
            group=group,
            rep=rep,
            count=count,
            features=x,
            prior=cpu_delta / PRIOR_SCALE_MILLI,
            card_free=card_free,
        )

    def cluster_context(self, state: ClusterState, feasible: int, groups: int) -> np.ndarray:
        """float32[len(CLUSTER_FEATURES)]: the cluster-level columns for a pod with ``feasible``
        feasible nodes in ``groups`` groups (also what the value head sees when no node fits)."""
        fgd, _ = self.measures(state)
        return self._cluster_columns(state, feasible, groups, fgd.cluster_frag(state))

    @staticmethod
    def _cluster_columns(state: ClusterState, feasible: int, groups: int, cluster_frag: float) -> np.ndarray:
        gpu_alloc, full_free, cpu_free = cluster_fill(state)
        return np.array(
            [
                gpu_alloc,
                full_free,
                cluster_frag / max(_capacity(state)[0] * MILLI_PER_CARD, 1),
                cpu_free,
                feasible / state.num_nodes,
                groups / max(feasible, 1),
            ],
            dtype=np.float32,
        )

    def node_cards(self, state: ClusterState, req: PodRequest, cand: Candidates) -> np.ndarray | None:
        """For a share pod, int64[K]: the card each candidate node would give (FGD-CPU's choice); else None.

        FGD-CPU takes the first card (lowest index) among those with the best score, and cards with
        equal free milli score alike, so on every node of a group it is the first card whose free
        milli equals the one chosen on the group's representative.
        """
        if not req.is_share:
            return None
        want = cand.card_free[cand.group]
        cards: np.ndarray = (state.card_free[cand.nodes] == want[:, None]).argmax(axis=1)
        return cards

    def cards_at(self, state: ClusterState, req: PodRequest, cand: Candidates, position: int) -> tuple[int, ...]:
        """The card(s) the pod gets on ``cand.nodes[position]``: FGD-CPU's card for a share pod, else
        the default rule."""
        node = int(cand.nodes[position])
        if req.is_share:
            want = cand.card_free[cand.group[position]]
            return (int((state.card_free[node] == want).argmax()),)
        return default_cards(state, req, node)


def pod_columns(req: PodRequest) -> list[float]:
    """The pod's own columns (:data:`POD_FEATURES`, in order): the same in every row of one pod."""
    return [
        req.cpu_milli / MAX_CPU,
        req.memory_mib / MAX_MEM,
        req.num_gpu / 8.0,
        (req.gpu_milli if req.is_gpu else 0) / MILLI_PER_CARD,
        req.gpu_total / MAX_GPU,
        float(req.is_share),
        float(req.is_gpu and not req.is_share),
        float(not req.is_gpu),
        float(req.constrained),
    ]


def qos_columns(latency_sensitive: bool, ls_pods: np.ndarray, pods: np.ndarray) -> list[Any]:
    """:data:`QOS_FEATURES` for a pod on nodes running ``ls_pods`` latency-sensitive pods of ``pods``."""
    ls, other = _capped_counts(ls_pods, pods)
    return [float(latency_sensitive), ls / QOS_POD_CAP, other / QOS_POD_CAP]


def _with_counts(keys: np.ndarray, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
    """``keys`` that also tell apart nodes whose capped QoS pod counts differ (what :func:`qos_columns`
    reads, so a group's nodes share their QoS columns). Exact: :func:`node_keys` are small, and
    ``ls * (QOS_POD_CAP + 1) + other`` is below the multiplier."""
    ls, other = _capped_counts(state.ls_pods[nodes], state.pods[nodes])
    mixed: np.ndarray = keys * np.int64(1_000_003) + ls * np.int64(QOS_POD_CAP + 1) + other
    return mixed


def _capped_counts(ls_pods: np.ndarray, pods: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(latency-sensitive pods, other pods) per node, each capped at :data:`QOS_POD_CAP`."""
    return np.minimum(ls_pods, QOS_POD_CAP), np.minimum(pods - ls_pods, QOS_POD_CAP)


def cluster_fill(state: ClusterState) -> tuple[float, float, float]:
    """How full the cluster is: ``cluster_gpu_alloc``, ``cluster_full_free`` and ``cluster_cpu_free``
    (fractions of GPU milli allocated, of cards fully free, of CPU free). CPU is summed in float64:
    three nodes overcommitted to the limit (``COUNT_LIMIT``, −2**62 each) wrap an int64 sum round."""
    cards, cpu_cap, _ = _capacity(state)
    capacity = cards * MILLI_PER_CARD
    return (
        (capacity - int(state.card_free.sum())) / max(capacity, 1),
        float(state.full_free.sum()) / max(cards, 1),
        float(state.cpu_free.sum(dtype=np.float64)) / max(cpu_cap, 1.0),
    )


def _capacity(state: ClusterState) -> tuple[int, float, float]:
    """(cards, cpu capacity in milli, mean node price): fixed for a state's life, so computed once."""
    cached = state.caches.get("feature-capacity")
    if cached is None:
        cached = state.caches["feature-capacity"] = (
            np.array([state.gpu_count.sum()], dtype=np.int64),
            np.array([state.cpu_cap.sum(dtype=np.float64), _mean_price(state.price)], dtype=np.float64),
        )
    cards, floats = cached
    return int(cards[0]), float(floats[0]), float(floats[1])


def _mean_price(price: np.ndarray) -> float:
    """The mean of ``price``, also where the plain sum overflows (two prices near float64's largest
    value; the extender refuses prices above :data:`~rlsched.extender.objects.MAX_PRICE`, but a spec
    built in code or read from a trace is not bounded so): inf would read every ``price_rel`` as 0."""
    with np.errstate(over="ignore"):
        mean = float(price.mean())
    if math.isinf(mean) and np.isfinite(price).all():
        top = float(price.max())
        mean = top * float((price / top).mean())
    return mean


def _factorize(keys: np.ndarray, extra: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Groups of equal ``keys`` (and equal rows of ``extra``, float[K, M], if given), numbered by first
    appearance: (first position of each group, group of each key, size of each group). What
    ``np.unique(return_index, return_inverse, return_counts)`` gives, renumbered by first position,
    without its general-purpose overhead (this runs per pod)."""
    n = len(keys)
    # A stable sort keeps equal keys in position order, so each group's first entry is its lowest.
    perm = np.argsort(keys, kind="stable") if extra is None else np.lexsort((*extra.T[::-1], keys))
    ordered = keys[perm]
    starts_here = np.empty(n, dtype=np.bool_)
    starts_here[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=starts_here[1:])
    if extra is not None:
        rows = extra[perm]
        starts_here[1:] |= (rows[1:] != rows[:-1]).any(axis=1)
    starts = starts_here.nonzero()[0]
    first = perm[starts]
    count = np.empty(len(starts), dtype=np.int64)
    count[:-1] = starts[1:] - starts[:-1]
    count[-1:] = n - starts[-1:]
    order = first.argsort()
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    group = np.empty(n, dtype=np.int64)
    group[perm] = rank[starts_here.cumsum() - 1]
    return first[order], group, count[order]


def _write(x: np.ndarray, columns: slice, values: list[Any]) -> None:
    """``x[:, columns] = values``, one column per value (arrays of one value per row, or scalars)."""
    for i, value in zip(range(columns.start, columns.stop), values, strict=True):
        x[:, i] = value


@numpy_kernel
def _node_columns(
    cpu_cap: np.ndarray,
    mem_cap: np.ndarray,
    cpu_free: np.ndarray,
    mem_free: np.ndarray,
    cards: np.ndarray,
    full_free: np.ndarray,
    gpu_count: np.ndarray,
    pod_cpu: int,
    pod_mem: int,
    pod_gpu_total: int,
    pod_milli: int,
    pod_num_gpu: int,
    pod_is_share: bool,
    share_card: np.ndarray,
    x: np.ndarray,
    start: int,
    card_free: np.ndarray,
) -> None:
    """Columns :data:`NODE_FEATURES` then :data:`AFTER_FEATURES` of ``x``, from column ``start``, for
    each row's node (arrays indexed by row); for a share pod also ``card_free[row]``, the free milli of
    the card it would get (``share_card[row]``).

    The fractions divide by at least 1: a node with no allocatable cpu or memory (cpu "0", or memory
    under 1 MiB, read as 0 MiB) reads as having no room rather than NaN, which would make the model's
    scores NaN; on every other node the value is the plain quotient, bit for bit.

    One kernel instead of ~40 small numpy operations per pod, value for value what those gave
    (float64 arithmetic, stored as float32; tests/unit/test_features.py keeps the numpy version). Plain
    loops rather than np.sort and sum: they compile in under half the time, which every start of an
    extender without a numba cache pays."""
    slots = min(CARD_SLOTS, cards.shape[1])
    ordered = np.empty(cards.shape[1], dtype=np.int64)
    for r in range(x.shape[0]):
        cpu = float(cpu_free[r])
        mem = float(mem_free[r])
        full = float(full_free[r])
        total = 0.0
        for k in range(cards.shape[1]):
            total += cards[r, k]
        c = start
        x[r, c] = cpu / MAX_CPU
        x[r, c + 1] = cpu / max(cpu_cap[r], 1)
        x[r, c + 2] = mem / MAX_MEM
        x[r, c + 3] = mem / max(mem_cap[r], 1)
        x[r, c + 4] = gpu_count[r] / 8.0
        x[r, c + 5] = full / 8.0
        x[r, c + 6] = total / MAX_GPU
        # card_free_i: the i-th most free card, in cards (an insertion sort, most free first)
        for k in range(cards.shape[1]):
            v = cards[r, k]
            j = k
            while j > 0 and ordered[j - 1] < v:
                ordered[j] = ordered[j - 1]
                j -= 1
            ordered[j] = v
        for i in range(CARD_SLOTS):
            x[r, c + 7 + i] = ordered[i] / MILLI_PER_CARD if i < slots else 0.0
        c += 7 + CARD_SLOTS
        x[r, c] = _per_card(cpu, full, CPU_PER_CARD)
        x[r, c + 1] = _per_card(mem, full, MEM_PER_CARD)
        # after placing
        cpu_left = cpu - pod_cpu
        mem_left = mem - pod_mem
        if pod_is_share:
            card_free[r] = cards[r, share_card[r]]
            full_after = full - (1.0 if card_free[r] == MILLI_PER_CARD else 0.0)
            card_left = (card_free[r] - pod_milli) / MILLI_PER_CARD
        else:
            full_after = full - pod_num_gpu
            card_left = 0.0
        gpu_left = total - pod_gpu_total
        c += 2
        x[r, c] = cpu_left / MAX_CPU
        x[r, c + 1] = cpu_left / max(cpu_cap[r], 1)
        x[r, c + 2] = mem_left / max(mem_cap[r], 1)
        x[r, c + 3] = gpu_left / MAX_GPU
        x[r, c + 4] = full_after / 8.0
        x[r, c + 5] = card_left
        x[r, c + 6] = _per_card(cpu_left, full_after, CPU_PER_CARD)
        x[r, c + 7] = _per_card(mem_left, full_after, MEM_PER_CARD)
        x[r, c + 8] = 0.5 * cpu_left / MAX_CPU + 0.5 * gpu_left / MAX_GPU


@numpy_kernel
def _per_card(amount: float, free_cards: float, scale: float) -> float:
    """``amount`` per fully free card, scaled and capped; the cap where no card is free."""
    if free_cards > 0:
        return min(amount / max(free_cards, 1.0) / scale, PER_CARD_CAP)
    return PER_CARD_CAP


NODE_KEY_TABLE_SLACK = 1024
""":func:`node_keys` starts its table of values over once it holds more than two entries per node plus
this many: every change of a node may add one, and a long-lived state must not grow without bound."""


def node_keys(state: ClusterState) -> np.ndarray:
    """int64[N]: a key per node, equal exactly when the nodes are interchangeable (cached per ``node_version``).

    The key covers capacity, model, price, free cpu and memory and the multiset of free milli per
    card; load is compared separately because it changes without a ``node_version`` bump. A key is
    the number a table of the exact values seen gave the node's values (a dict, which compares values
    whose hashes are equal), not a hash of them: Python hashes an int modulo 2**61 − 1 and
    ``hash(-1) == hash(-2)``, so nodes overcommitted by different amounts would share a hash and be
    scored with each other's features. Numbers come from one counter, so two values never share one,
    even with a second thread filling the table (a model call still running past its deadline); and
    they stay small (about the table's bound, :data:`NODE_KEY_TABLE_SLACK`), as :func:`_with_counts`
    needs.
    """
    cached = state.caches.get("feature-node-keys")
    if cached is None or len(cached[3].item()) > 2 * state.num_nodes + NODE_KEY_TABLE_SLACK:
        # A new table renumbers every node; threads still holding the old one finish with it.
        kinds = np.column_stack(
            [state.cpu_cap, state.mem_cap, state.gpu_count, state.model_id, state.price.view(np.int64)]
        )
        _, kind = np.unique(kinds, axis=0, return_inverse=True)
        table = np.empty((), dtype=object)  # the dict in a 0-d array: state.caches holds arrays
        table[()] = defaultdict(itertools.count().__next__)
        cached = state.caches["feature-node-keys"] = (
            kind.reshape(-1).astype(np.int64),
            np.zeros(state.num_nodes, dtype=np.int64),
            np.full(state.num_nodes, -1, dtype=np.int64),
            table,
        )
    kind, keys, versions, table = cached
    numbers: defaultdict[tuple[int, ...], int] = table.item()
    stale = np.flatnonzero(versions != state.node_version)
    if len(stale):
        seen = state.node_version[stale]  # read first (see Fragmentation.node_frag)
        cpu = state.cpu_free[stale].tolist()
        mem = state.mem_free[stale].tolist()
        cards = np.sort(state.card_free[stale], axis=1).tolist()
        kinds = kind[stale].tolist()
        keys[stale] = [numbers[(k, c, m, *row)] for k, c, m, row in zip(kinds, cpu, mem, cards, strict=True)]
        versions[stale] = seen
    return keys
