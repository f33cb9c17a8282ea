"""The brain of kube-rl-scheduler and the domain model every part shares.

- :mod:`.cluster` — :class:`NodeSpec`, :class:`PodSpec`, :class:`ClusterState` (arrays over nodes).
- :mod:`.feasibility` / :mod:`.cards` — which nodes fit a pod, which cards it gets.
- :mod:`.trace` — openb CSV and the generic YAML/JSON format; :class:`TraceError`.
- :mod:`.typical` / :mod:`.fragmentation` — FGD's typical pods and fragmentation measure.
- :mod:`.scorers` — baseline scorers and :func:`make_scorer` (``ppo:PATH`` for learned policies).
- :mod:`.decision` — :func:`decide`: feasible nodes → scores → node and cards.
- :mod:`.simulator` / :mod:`.events` — the FGD protocol and the event-driven replay.
- :mod:`.evaluate` — ``rlsched evaluate``.
"""

from .cards import default_cards, tightest_card
from .cluster import ClusterState, NodeSpec, Placement, PodRequest, PodSpec, pod_request_problem
from .decision import Decision, decide
from .feasibility import feasible_mask, feasible_nodes, infeasibility_reason, unresolvable_mask
from .fragmentation import Fragmentation
from .resources import MILLI_PER_CARD
from .scorers import NodeScores, Scorer, TieBreak, make_scorer, scorer_names
from .simulator import RunResult, run_fgd_protocol, run_sequence
from .trace import TraceError, load_nodes, load_pods
from .typical import TypicalPods, typical_pods
from .workload import inflate

__all__ = [
    "MILLI_PER_CARD",
    "ClusterState",
    "Decision",
    "Fragmentation",
    "NodeScores",
    "NodeSpec",
    "Placement",
    "PodRequest",
    "PodSpec",
    "RunResult",
    "Scorer",
    "TieBreak",
    "TraceError",
    "TypicalPods",
    "decide",
    "default_cards",
    "feasible_mask",
    "feasible_nodes",
    "infeasibility_reason",
    "inflate",
    "load_nodes",
    "load_pods",
    "make_scorer",
    "pod_request_problem",
    "run_fgd_protocol",
    "run_sequence",
    "scorer_names",
    "tightest_card",
    "typical_pods",
    "unresolvable_mask",
]
