"""The cluster model shared by the simulator, the trainer and the extender.

Nodes and pods are described by small immutable specs (:class:`NodeSpec`, :class:`PodSpec`);
the mutable state of a cluster lives in :class:`ClusterState`, a handful of numpy arrays indexed
by node, so that feasibility and every scorer run vectorized over all nodes at once.

GPU model: a node has ``gpu_count`` cards of :data:`~rlsched.policy.resources.MILLI_PER_CARD`
milli each, all of one ``gpu_model``. ``card_free[n, c]`` is the free milli on card ``c`` of node
``n``; cards a node does not have are stored as 0 free, which no pod can use.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .resources import MEMORY_MIB_LIMIT, MILLI_PER_CARD, clip

DEFAULT_MILLI_CPU_REQUEST = 100
"""Kubernetes counts a pod without a cpu request as 100m when scoring."""
DEFAULT_MEMORY_REQUEST_BYTES = 200 * 1024 * 1024
"""...and one without a memory request as 200 MB."""
MIB = 1 << 20
COUNT_LIMIT = 2**62
"""A node's running totals stay within ±this: free cpu (milli), free memory (in bytes, though held
in MiB) and the requests Kubernetes' scorers see (cpu milli, memory bytes). A running pod is counted
whatever it asked (:meth:`ClusterState.place`'s ``overcommit``) and a request reads as up to
:data:`~rlsched.policy.resources.QUANTITY_LIMIT` (2**53), so 1,024 such pods on one node would wrap
an int64 total round to a large free amount; a pod that would take a total past this is refused
(512 of the largest requests fit, and the scorers' sums of a total and a request still fit in int64)."""


def nonzero_cpu(cpu_milli: int) -> int:
    """The cpu request Kubernetes' scorers see (``GetNonzeroRequests``)."""
    return cpu_milli if cpu_milli > 0 else DEFAULT_MILLI_CPU_REQUEST


def nonzero_cpu_array(cpu_milli: np.ndarray) -> np.ndarray:
    """:func:`nonzero_cpu` of each entry (int64)."""
    cpu = np.asarray(cpu_milli, dtype=np.int64)
    return np.where(cpu > 0, cpu, DEFAULT_MILLI_CPU_REQUEST)


def nonzero_mem_bytes(memory_mib: int) -> int:
    """The memory request, in bytes, Kubernetes' scorers see."""
    return memory_mib * MIB if memory_mib > 0 else DEFAULT_MEMORY_REQUEST_BYTES


LATENCY_SENSITIVE = frozenset({"LS", "Guaranteed"})
"""QoS classes counted as latency-sensitive (openb's ``LS``; Kubernetes' ``Guaranteed``): what the
living-cluster SLA count follows and what the ``pod_latency_sensitive`` feature says."""

LOAD_METRICS = ("cpu", "memory", "network", "disk")
"""Columns of :attr:`ClusterState.load`."""


@dataclass(frozen=True)
class NodeSpec:
    """A node's capacity."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int = 0
    gpu_model: str = ""
    """GPU model name (``V100M16``, ``T4``...); empty for CPU-only nodes."""
    labels: Mapping[str, str] = field(default_factory=dict)
    price: float = 1.0
    """Relative cost of running the node (per hour, any unit); policies may prefer cheaper nodes."""

    def __post_init__(self) -> None:
        if self.price < 0:
            raise ValueError(f"node {self.name!r}: price must not be negative")
        if self.cpu_milli < 0 or self.memory_mib < 0 or self.gpu_count < 0:
            raise ValueError(f"node {self.name!r}: cpu, memory and gpu must not be negative")
        if self.memory_mib >= MEMORY_MIB_LIMIT:
            raise ValueError(f"node {self.name!r}: {memory_problem(self.memory_mib, MEMORY_MIB_LIMIT - 1)}")
        if self.gpu_count > 0 and not self.gpu_model:
            raise ValueError(f"node {self.name!r}: has {self.gpu_count} GPUs but no GPU model")


@dataclass(frozen=True)
class CpuPrediction:
    """A Kubernetes pod's cpu as Trimaran's TargetLoadPacking reads it (``PredictUtilisation`` over
    ``spec.containers``, init containers not counted, plus ``spec.overhead``), before the scorer's two
    parameters: :func:`rlsched.policy.scorers.trimaran.predict_pod_cpu_milli` turns it into millicores.
    The extender reads it from the pod (:func:`rlsched.extender.objects.pod_info`); a trace pod, which
    has only a request, has none, and the scorer predicts from its request alone."""

    limits_milli: int = 0
    """Σ cpu limit of the containers that set one (each predicted at its limit), plus the overhead's cpu."""
    requests_milli: tuple[int, ...] = ()
    """The cpu request of each container with a request and no limit (each predicted at
    ``round(request · multiplier)``)."""
    unset: int = 0
    """Containers with neither (each predicted at the default millicores)."""


@dataclass(frozen=True)
class PodSpec:
    """What a pod asks for.

    ``num_gpu`` whole cards of ``gpu_milli == 1000`` each, or a share of one card
    (``num_gpu == 1``, ``0 < gpu_milli < 1000``), or no GPU (``num_gpu == 0``, ``gpu_milli == 0``).
    ``gpu_models`` restricts the card model (any model when empty).
    """

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int = 0
    gpu_milli: int = 0
    gpu_models: tuple[str, ...] = ()
    creation_time: float | None = None
    deletion_time: float | None = None
    qos: str = ""
    """The trace's QoS class (openb: ``LS`` latency-sensitive, ``BE`` best-effort, ``Burstable``,
    ``Guaranteed``); empty when unknown. The living-cluster mode draws usage and counts SLA by it, and
    a model trained with the QoS features sees whether it is :data:`LATENCY_SENSITIVE`."""
    cpu_prediction: CpuPrediction | None = None
    """What TargetLoadPacking predicts the pod's cpu from, for a Kubernetes pod (its containers' limits
    and requests); None for a trace pod, predicted from ``cpu_milli`` as a request without a limit."""

    def __post_init__(self) -> None:
        problem = pod_request_problem(self.cpu_milli, self.memory_mib, self.num_gpu, self.gpu_milli)
        if problem:
            raise ValueError(f"pod {self.name!r}: {problem}")

    @property
    def is_share(self) -> bool:
        """True when the pod asks for a share of one card."""
        return self.num_gpu == 1 and self.gpu_milli < MILLI_PER_CARD

    @property
    def gpu_request_milli(self) -> int:
        """Total GPU milli the pod asks for (``num_gpu × gpu_milli``)."""
        return self.num_gpu * self.gpu_milli


def pod_request_problem(cpu_milli: int, memory_mib: int, num_gpu: int, gpu_milli: int) -> str | None:
    """Why a pod request is invalid, or None. One rule set for traces, Kubernetes pods and tests."""
    if cpu_milli < 0 or memory_mib < 0:
        return "cpu and memory must not be negative"
    if memory_mib > MEMORY_MIB_LIMIT:
        return memory_problem(memory_mib, MEMORY_MIB_LIMIT)
    if num_gpu < 0:
        return f"num_gpu must not be negative (got {num_gpu})"
    if num_gpu == 0:
        if gpu_milli != 0:
            return f"gpu_milli is {gpu_milli} but num_gpu is 0 (a share of a card needs num_gpu = 1)"
        return None
    if not 0 < gpu_milli <= MILLI_PER_CARD:
        return f"gpu_milli must be in 1..{MILLI_PER_CARD} when num_gpu > 0 (got {gpu_milli})"
    if num_gpu > 1 and gpu_milli != MILLI_PER_CARD:
        return f"a pod asking for {num_gpu} GPUs must take whole cards (gpu_milli = {MILLI_PER_CARD}, got {gpu_milli})"
    return None


def memory_limit_text(most: int) -> str:
    """Why memory above ``most`` MiB (:data:`~rlsched.policy.resources.MEMORY_MIB_LIMIT`, or one less for a
    node) is refused, for messages: the scorers count memory in bytes in int64, as Kubernetes does."""
    return f"at most {most} MiB, 8 PiB: memory is counted in bytes, which must stay below 2**53"


def memory_problem(memory_mib: int, most: int) -> str:
    """What to say of a memory amount above ``most`` MiB."""
    return f"memory {clip(memory_mib)} MiB is unreasonably large ({memory_limit_text(most)})"


@dataclass(frozen=True)
class PodRequest:
    """A pod in the cluster's terms: plain numbers plus a mask over the cluster's GPU models.

    Built by :meth:`ClusterState.request`; scorers and feasibility take this, not :class:`PodSpec`.
    """

    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    model_ok: np.ndarray
    """bool[n_models + 1]: entry ``m`` says whether model id ``m`` is allowed; the last entry (id -1,
    CPU-only nodes) is always False for GPU pods."""
    constrained: bool
    """True when the pod restricts the GPU model."""
    latency_sensitive: bool = False
    """The pod's QoS class is one of :data:`LATENCY_SENSITIVE`."""
    cpu_prediction: CpuPrediction | None = None
    """:attr:`PodSpec.cpu_prediction` (TargetLoadPacking reads it)."""

    @property
    def is_gpu(self) -> bool:
        return self.num_gpu > 0

    @property
    def is_share(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < MILLI_PER_CARD

    @property
    def gpu_total(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def kind(self) -> int:
        """GPU affinity kind: 0 share of a card, k for k whole cards, -1 CPU-only."""
        if not self.is_gpu:
            return -1
        return 0 if self.is_share else self.num_gpu


@dataclass(frozen=True)
class Placement:
    """Where a pod went: node index, card indices, and the milli taken on each card."""

    node: int
    cards: tuple[int, ...]
    milli_per_card: int
    cpu_milli: int
    memory_mib: int
    kind: int
    latency_sensitive: bool = False


def packed_copies(names: list[str]) -> list[str]:
    """Copies of ``names`` allocated one after another.

    The extender maps the ~400 node names of every filter request through :attr:`ClusterState.index`;
    a lookup compares the request's string with the stored key, so it touches that key's memory. Names
    read from the watch one node at a time lie scattered over megabytes of heap, and between two
    requests the other processes on the node push them out of the CPU caches: 1,000 nodes, 420 names,
    caches cleared, 0.20 ms for the lookups against 0.07–0.13 ms with the keys packed together (0.02 ms
    warm either way). Splitting one joined string allocates the copies in sequence; a name holding the
    separator (no Kubernetes name can) keeps the names as they are.
    """
    copies = "\0".join(names).split("\0")
    return copies if len(copies) == len(names) else list(names)


class ClusterState:
    """Mutable cluster state as arrays over nodes (``N`` nodes, ``C`` card slots per node).

    Derived arrays (``full_free``, ``max_card_free``) are kept in step by :meth:`place` and
    :meth:`release` because feasibility reads them for every pod.
    """

    def __init__(self, nodes: Sequence[NodeSpec]):
        if not nodes:
            raise ValueError("a cluster needs at least one node")
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            dupes = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"duplicate node names: {', '.join(dupes[:5])}")
        names = packed_copies(names)
        self.nodes: tuple[NodeSpec, ...] = tuple(nodes)
        self.names: tuple[str, ...] = tuple(names)
        self.index: dict[str, int] = {name: i for i, name in enumerate(names)}
        self.model_names: tuple[str, ...] = tuple(sorted({n.gpu_model for n in nodes if n.gpu_model}))
        model_id = {m: i for i, m in enumerate(self.model_names)}
        n = len(nodes)
        self.max_cards = max(1, max(node.gpu_count for node in nodes))
        self.cpu_cap = np.array([node.cpu_milli for node in nodes], dtype=np.int64)
        self.mem_cap = np.array([node.memory_mib for node in nodes], dtype=np.int64)
        self.gpu_count = np.array([node.gpu_count for node in nodes], dtype=np.int64)
        # -1 for CPU-only nodes; PodRequest.model_ok[-1] covers it.
        self.model_id = np.array([model_id[node.gpu_model] if node.gpu_model else -1 for node in nodes], dtype=np.int64)
        self.card_exists = np.arange(self.max_cards)[None, :] < self.gpu_count[:, None]
        self.cpu_free = self.cpu_cap.copy()
        self.mem_free = self.mem_cap.copy()
        self.card_free = np.where(self.card_exists, MILLI_PER_CARD, 0).astype(np.int64)
        self.full_free = self.gpu_count.copy()
        self.max_card_free = np.where(self.gpu_count > 0, MILLI_PER_CARD, 0).astype(np.int64)
        # GPU pods per affinity kind (0 share, k = k whole cards), for GpuClustering.
        self.kind_count = np.zeros((n, self.max_cards + 1), dtype=np.int64)
        self.gpu_pods = np.zeros(n, dtype=np.int64)
        self.pods = np.zeros(n, dtype=np.int64)
        """Pods placed per node (every kind)."""
        self.ls_pods = np.zeros(n, dtype=np.int64)
        """Latency-sensitive pods placed per node (:attr:`PodRequest.latency_sensitive`)."""
        self.price = np.array([node.price for node in nodes], dtype=np.float64)
        self.load = np.full((n, len(LOAD_METRICS)), np.nan, dtype=np.float64)
        """Measured utilization per node and :data:`LOAD_METRICS` entry, 0..1; NaN where unknown
        (the extender fills it from Prometheus; simulators may model it)."""
        self.load_std = np.full((n, len(LOAD_METRICS)), np.nan, dtype=np.float64)
        """Standard deviation of :attr:`load` over the measurement window, same shape and units; NaN
        where unknown (LoadVariationRiskBalancing reads it)."""
        # Kubernetes' "non-zero requested": a pod without a cpu/memory request counts as 100m / 200 MB
        # when scoring (pkg/scheduler/util/pod_resources.go). Memory in bytes to keep Go's arithmetic.
        self.nonzero_cpu_used = np.zeros(n, dtype=np.int64)
        self.nonzero_mem_used_bytes = np.zeros(n, dtype=np.int64)
        self.node_version = np.zeros(n, dtype=np.int64)
        """Bumped on every change of a node, so per-node caches (fragmentation, features) can tell
        which rows moved by comparing with the versions they were computed at."""
        self.caches: dict[Hashable, tuple[np.ndarray, ...]] = {}
        """Per-state derived arrays owned by scorers and encoders, keyed by their owner (a name, or a
        (name, instance) pair), typically per-node values with the ``node_version`` they were computed
        at; a copy starts with none."""

    # -- size ---------------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return len(self.names)

    @property
    def gpu_milli_capacity(self) -> int:
        return int(self.gpu_count.sum()) * MILLI_PER_CARD

    @property
    def gpu_milli_allocated(self) -> int:
        return self.gpu_milli_capacity - int(self.card_free.sum())

    # -- pods ---------------------------------------------------------------------------------
    def request(self, pod: PodSpec) -> PodRequest:
        """The pod's request in this cluster's terms (model constraint → mask over model ids)."""
        model_ok = np.zeros(len(self.model_names) + 1, dtype=np.bool_)
        if pod.num_gpu > 0:
            if pod.gpu_models:
                allowed = set(pod.gpu_models)
                model_ok[: len(self.model_names)] = [m in allowed for m in self.model_names]
            else:
                model_ok[: len(self.model_names)] = True
        else:
            model_ok[:] = True
        return PodRequest(
            cpu_milli=pod.cpu_milli,
            memory_mib=pod.memory_mib,
            num_gpu=pod.num_gpu,
            gpu_milli=pod.gpu_milli,
            model_ok=model_ok,
            constrained=bool(pod.gpu_models) and pod.num_gpu > 0,
            latency_sensitive=pod.qos in LATENCY_SENSITIVE,
            cpu_prediction=pod.cpu_prediction,
        )

    def short_of_cpu_or_memory(self, req: PodRequest, node: int) -> bool:
        """Whether ``node`` lacks the pod's cpu or memory. A request of 0 never does, as in kube-scheduler's
        NodeResourcesFit: running pods are counted whatever they asked (:meth:`place`'s ``overcommit``),
        so a node's free cpu or memory can be below 0."""
        return bool(
            (req.cpu_milli > 0 and self.cpu_free[node] < req.cpu_milli)
            or (req.memory_mib > 0 and self.mem_free[node] < req.memory_mib)
        )

    def _past_count_limit(self, req: PodRequest, node: int) -> bool:
        """Whether placing the pod would take one of ``node``'s totals past :data:`COUNT_LIMIT` (in
        Python integers: the check itself cannot wrap). Only ``overcommit`` needs it: a pod that fits
        takes no more than the node has free, or adds the 100m or 200 MB counted for a request of
        nothing, which would take 2**34 pods to matter."""
        return bool(
            int(self.cpu_free[node]) - req.cpu_milli < -COUNT_LIMIT
            or (int(self.mem_free[node]) - req.memory_mib) * MIB < -COUNT_LIMIT
            or int(self.nonzero_cpu_used[node]) + nonzero_cpu(req.cpu_milli) > COUNT_LIMIT
            or int(self.nonzero_mem_used_bytes[node]) + nonzero_mem_bytes(req.memory_mib) > COUNT_LIMIT
        )

    def place(
        self, req: PodRequest, node: int, cards: Iterable[int], overcommit: bool = False, any_model: bool = False
    ) -> Placement:
        """Put a pod on ``node`` using ``cards``. Raises ValueError if it does not fit there.

        ``overcommit``: place it even when cpu or memory run short (free goes below 0), as
        kube-scheduler's node info counts a pod that is already running there whatever it asked;
        its cards are still checked, and it is refused if it would take one of the node's totals past
        :data:`COUNT_LIMIT`. ``any_model`` (implied by ``overcommit``): its GPU-model
        constraint is not checked (a running pod: another scheduler may have put it there, or the
        node's model label changed since)."""
        cards = tuple(int(c) for c in cards)
        milli = req.gpu_milli if req.is_gpu else 0
        if len(cards) != req.num_gpu:
            raise ValueError(f"pod asks for {req.num_gpu} card(s), got {len(cards)}")
        if not overcommit and self.short_of_cpu_or_memory(req, node):
            raise ValueError(f"node {self.names[node]}: not enough cpu or memory")
        if overcommit and self._past_count_limit(req, node):
            raise ValueError(f"node {self.names[node]}: its pods ask for more than can be counted (2**62)")
        if len(set(cards)) != len(cards):
            raise ValueError(f"node {self.names[node]}: card ids repeat: {cards}")
        for c in cards:
            if not 0 <= c < self.gpu_count[node] or self.card_free[node, c] < milli:
                raise ValueError(f"node {self.names[node]}: card {c} has not {milli} milli free")
        if req.is_gpu and not (overcommit or any_model) and not req.model_ok[self.model_id[node]]:
            raise ValueError(f"node {self.names[node]}: GPU model not allowed for this pod")
        self.cpu_free[node] -= req.cpu_milli
        self.mem_free[node] -= req.memory_mib
        self.nonzero_cpu_used[node] += nonzero_cpu(req.cpu_milli)
        self.nonzero_mem_used_bytes[node] += nonzero_mem_bytes(req.memory_mib)
        for c in cards:
            self.card_free[node, c] -= milli
        if req.is_gpu:
            self.kind_count[node, req.kind] += 1
            self.gpu_pods[node] += 1
        self.pods[node] += 1
        self.ls_pods[node] += int(req.latency_sensitive)
        self._node_changed(node)
        return Placement(node, cards, milli, req.cpu_milli, req.memory_mib, req.kind, req.latency_sensitive)

    def hold(self, req: PodRequest, node: int) -> None:
        """Count on ``node`` a pod that does not fit there yet, in a trial copy (it cannot be
        released): its cpu and memory whatever is free (free may go below 0), and the card room it
        could use of what is free now — for whole cards, up to its count of the fully free cards;
        for a share, up to its share of every card. This is how kube-scheduler counts a pod that its
        preemption nominated to a node while the victims are still leaving (the pod is added to the
        node even where it overfills it), for the cards it cannot see: the room is not lent to pods
        of lower priority meanwhile. ValueError when that would take one of the node's totals past
        :data:`COUNT_LIMIT`."""
        if self._past_count_limit(req, node):
            raise ValueError(f"node {self.names[node]}: its pods ask for more than can be counted (2**62)")
        self.cpu_free[node] -= req.cpu_milli
        self.mem_free[node] -= req.memory_mib
        self.nonzero_cpu_used[node] += nonzero_cpu(req.cpu_milli)
        self.nonzero_mem_used_bytes[node] += nonzero_mem_bytes(req.memory_mib)
        if req.is_gpu:
            row = self.card_free[node, : self.gpu_count[node]]
            if req.is_share:
                row -= np.minimum(row, req.gpu_milli)
            else:
                row[np.flatnonzero(row == MILLI_PER_CARD)[: req.num_gpu]] = 0
            self.kind_count[node, req.kind] += 1
            self.gpu_pods[node] += 1
        self.pods[node] += 1
        self.ls_pods[node] += int(req.latency_sensitive)
        self._node_changed(node)

    def release(self, placement: Placement) -> None:
        """Undo :meth:`place` (a pod left the node)."""
        node = placement.node
        cards = list(placement.cards)
        if (
            self.cpu_free[node] + placement.cpu_milli > self.cpu_cap[node]
            or self.mem_free[node] + placement.memory_mib > self.mem_cap[node]
            or self.nonzero_cpu_used[node] < nonzero_cpu(placement.cpu_milli)
            or (self.card_free[node, cards] + placement.milli_per_card > MILLI_PER_CARD).any()
            or (placement.kind >= 0 and self.kind_count[node, placement.kind] < 1)
            or self.pods[node] < 1
            or self.ls_pods[node] < int(placement.latency_sensitive)
        ):
            # Checked before changing anything, so a bad release leaves the state as it was.
            raise ValueError(f"node {self.names[node]}: released more than was placed")
        self.cpu_free[node] += placement.cpu_milli
        self.mem_free[node] += placement.memory_mib
        self.nonzero_cpu_used[node] -= nonzero_cpu(placement.cpu_milli)
        self.nonzero_mem_used_bytes[node] -= nonzero_mem_bytes(placement.memory_mib)
        for c in placement.cards:
            self.card_free[node, c] += placement.milli_per_card
        if placement.kind >= 0:
            self.kind_count[node, placement.kind] -= 1
            self.gpu_pods[node] -= 1
        self.pods[node] -= 1
        self.ls_pods[node] -= int(placement.latency_sensitive)
        self._node_changed(node)

    def _node_changed(self, node: int) -> None:
        row = self.card_free[node]
        self.full_free[node] = int((row == MILLI_PER_CARD).sum())
        self.max_card_free[node] = int(row.max())
        self.node_version[node] += 1

    def copy(self) -> ClusterState:
        """A deep copy sharing the immutable node specs."""
        other = object.__new__(ClusterState)
        other.__dict__.update(self.__dict__)
        for name in MUTABLE_ARRAYS:
            setattr(other, name, getattr(self, name).copy())
        other.caches = {}
        return other


MUTABLE_ARRAYS = (  # the per-node arrays that change as pods come and go (copy() copies these)
    "cpu_free",
    "mem_free",
    "nonzero_cpu_used",
    "nonzero_mem_used_bytes",
    "card_free",
    "full_free",
    "max_card_free",
    "kind_count",
    "gpu_pods",
    "pods",
    "ls_pods",
    "node_version",
    "load",
    "load_std",
)
