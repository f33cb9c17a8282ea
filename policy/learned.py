"""A trained policy as a :class:`~rlsched.policy.scorers.base.Scorer` — numpy only, no torch.

``load_learned_scorer("model.npz")`` (or ``make_scorer("ppo:model.npz", typical)``) returns an
object with the same call shape as the heuristics::

    scores = scorer.score(state, req, nodes)        # NodeScores: values[K] per node, cards[K] for share pods
    i      = scorer.choose(scores, nodes, tiebreak)  # position in nodes
    cards  = scorer.cards(state, req, nodes[i], i, scores, tiebreak)

so :func:`rlsched.policy.decide`, the simulator, the extender and any outside evaluator call it like
any other policy. ``values`` are the network's node scores (FGD-CPU prior + learned correction, in
logit units); ``choose`` adds the tie-break term and samples (or, in greedy mode, takes the best) —
see :mod:`rlsched.policy.network`. ``version`` and ``digest`` (sha256 of the file) identify the model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .cluster import ClusterState, PodRequest
from .delay_head import MAX_HOLD_S, DelayHead
from .export import UNREADABLE, ModelFileError, read_model, trained_with_load, trained_with_qos
from .feasibility import feasible_mask
from .features import CLUSTER_SLICE, Candidates, FeatureEncoder
from .network import DecisionRule, PolicyNetwork, choose_node, node_logits, rank_fraction
from .scorers.base import NodeScores, Scorer, TieBreak
from .typical import TypicalPods

__all__ = [
    "LearnedScorer",
    "ModelFileError",
    "load_learned_scorer",
    "learned_policy_path",
    "DEFAULT_MODEL",
    "SERVED_MODEL",
    "LEARNED_PREFIXES",
]

DEFAULT_MODEL = Path(__file__).resolve().parent / "models" / "ppo-openb-default.npz"
"""The bundled model (trained on the openb default trace; see docs/ppo.md): where training and the
documented fine-tuning runs start."""

SERVED_MODEL = DEFAULT_MODEL.with_name("ppo-openb-default-es.npz")
"""The model the chart and the local stack serve: the bundled model with its network fine-tuned by
evolution strategies on whole episodes, the same prior and rule (docs/ppo.md, "A network that
matters on the FGD protocol")."""

LEARNED_PREFIXES = {"ppo:": False, "ppo-prior:": True}
"""Policy-name prefixes of a model file, and whether the network's contribution is zeroed:
``ppo:PATH`` is the model as trained; ``ppo-prior:PATH`` is the *same* model with the learned
correction removed (the output layer zeroed), i.e. its hand-set prior and decision rule alone — the
ablation that measures what learning adds."""


def learned_policy_path(name: str) -> tuple[str, bool] | None:
    """``"ppo:m.npz"`` → ``("m.npz", False)``, ``"ppo-prior:m.npz"`` → ``("m.npz", True)``; None for
    any other policy name."""
    for prefix, prior_only in LEARNED_PREFIXES.items():
        if name.startswith(prefix):
            return name[len(prefix) :], prior_only
    return None


class LearnedScorer(Scorer):
    """A trained PPO policy behind the scorer interface."""

    name = "ppo"

    def __init__(
        self,
        network: PolicyNetwork,
        encoder: FeatureEncoder,
        decision: DecisionRule,
        manifest: dict[str, Any] | None = None,
        digest: str = "",
        path: str = "",
    ):
        self.network = network
        self.encoder = encoder
        self.decision = decision
        self.manifest = manifest or {}
        self.version = str(self.manifest.get("version", "unversioned"))
        """The model's version string (from its manifest)."""
        self.digest = digest
        """sha256 of the model file."""
        self.path = path
        self.last: Candidates | None = None
        """The candidates of the last :meth:`score` call (for diagnostics and the decision log)."""
        self._best_logit: float | None = None
        actions = self.manifest.get("actions") or {}
        args = (self.manifest.get("training") or {}).get("args") or {}
        self.delays = bool(actions.get("delay")) and not prior_only_version(self.version)
        """Whether the model was trained with the delay action (and is not the prior-only ablation)."""
        hold = args.get("hold_s", 60.0)
        if isinstance(hold, bool) or not isinstance(hold, (int, float)) or not 0 < hold <= MAX_HOLD_S:
            raise ModelFileError(
                f"model file {path}: training.args.hold_s {str(hold)[:40]!r} is not a hold of more than 0 and "
                f"at most {MAX_HOLD_S:.0f} s"
            )
        self.hold_s = float(hold)
        """How long a delay holds the pod back: the hold it was trained with."""
        self.delay_head: DelayHead | None = None
        """A learned hold rule stored with the model (:mod:`rlsched.policy.delay_head`); it answers
        the delay question in place of the network's special head."""

    @property
    def sees_load(self) -> bool:
        """Whether node load reaches the network (only for a model trained with live load)."""
        return self.encoder.use_load

    def score(self, state: ClusterState, req: PodRequest, nodes: np.ndarray) -> NodeScores:
        cand = self.encoder.encode(state, req, nodes)
        self.last = cand
        self._best_logit = None
        group_scores = self.network.scores(cand.features, cand.prior)
        return NodeScores(group_scores[cand.group], self.encoder.node_cards(state, req, cand))

    def logits(self, scores: NodeScores, nodes: np.ndarray, tiebreak: TieBreak) -> np.ndarray:
        """Per node, the logit the decision rule samples from."""
        return node_logits(
            scores.values, np.arange(len(nodes)), rank_fraction(tiebreak, nodes), self.decision.rank_scale
        )

    def choose(self, scores: NodeScores, nodes: np.ndarray, tiebreak: TieBreak) -> int:
        logits = self.logits(scores, nodes, tiebreak)
        self._best_logit = float(logits.max())
        return choose_node(logits, nodes, tiebreak, self.decision.mode)

    def verdict(
        self, state: ClusterState, req: PodRequest, nodes: np.ndarray, scores: NodeScores | None
    ) -> tuple[str, str, float] | None:
        """``("delay", reason, hold_s)`` when the model holds the pod back, else None.

        A model with a delay head (:mod:`rlsched.policy.delay_head`) holds when the head's logit is
        positive and some node of ``nodes`` fits. Otherwise, a model trained with the delay action holds when
        its special head rates holding above its best node (greedy, as it serves); called after
        :meth:`score` for the same pod (the extender's and the living cluster's order), and ``scores``
        None (no node, or one node, which kube-scheduler does not score) gives no verdict."""
        head = self.delay_head
        if head is not None:
            if scores is None and not (len(nodes) and feasible_mask(state, req)[nodes].any()):
                return None  # no node fits: the pod waits anyway, and is not "delayed by policy"
            logit = head.logit(state, req)
            if not head.holds(state, req):  # NaN does not hold
                return None
            return (
                "delay",
                f"the delay head rates waiting {head.hold_s:.0f}s above placing now ({logit:+.2f})",
                head.hold_s,
            )
        if not self.delays or scores is None or self.last is None:
            return None
        cand = self.last
        h2 = self.network.hidden(cand.features)
        pooled = self.network.pooled(h2, cand.count, cand.features[0, CLUSTER_SLICE])
        delay = float(self.network.special_logits(pooled)[0])
        best = self._best_logit if self._best_logit is not None else float(np.max(scores.values))
        if not delay > best:  # NaN never holds a pod
            return None
        return ("delay", f"the model rates waiting {self.hold_s:.0f}s above its best node", self.hold_s)


def prior_only_version(version: str) -> bool:
    return version.endswith("+prior-only")


def load_learned_scorer(
    path: str | Path, typical: TypicalPods | None = None, mode: str | None = None, prior_only: bool = False
) -> LearnedScorer:
    """Load a model file (see :mod:`rlsched.policy.export`) as a scorer.

    ``typical`` is the workload model for the fragmentation features (the evaluated workload's typical
    pods, as FGD uses); None takes the typical pods stored with the model. ``mode`` overrides the
    manifest's decision mode (``sample`` / ``greedy``). ``prior_only`` zeroes the network's output
    layer (``w_out``, ``b_out``): every node's score is then the prior alone, with the same features,
    typical pods and decision rule, and no delay head — the ablation of ``ppo-prior:PATH``. Raises
    :class:`ModelFileError` for a missing, corrupt or incompatible file.
    """
    params, manifest, digest = read_model(path)
    try:
        return _scorer(path, params, manifest, digest, typical, mode, prior_only)
    except ModelFileError:
        raise
    except UNREADABLE as exc:
        raise ModelFileError(f"model file {path}: {type(exc).__name__}: {str(exc)[:200]}") from None


def _scorer(
    path: str | Path,
    params: dict[str, np.ndarray],
    manifest: dict[str, Any],
    digest: str,
    typical: TypicalPods | None,
    mode: str | None,
    prior_only: bool,
) -> LearnedScorer:
    if typical is None:
        try:
            typical = TypicalPods.from_json(manifest["typicalPods"])
        except UNREADABLE as exc:
            raise ModelFileError(f"model file {path}: typical pods: {str(exc)[:200]}") from None
    net = manifest["network"]
    decision = manifest["decision"]
    rule = DecisionRule(rank_scale=float(decision["rankScale"]), mode=mode or decision["mode"])
    if prior_only:
        params = {**params, "w_out": np.zeros_like(params["w_out"]), "b_out": np.zeros_like(params["b_out"])}
        manifest = {**manifest, "version": f"{manifest.get('version', 'unversioned')}+prior-only"}
    network = PolicyNetwork(params, prior_scale=float(net["priorScale"]))
    encoder = FeatureEncoder(
        typical,
        cpu_weight=float(manifest["features"]["fgdCpuWeight"]),
        use_load=trained_with_load(manifest),
        use_qos=trained_with_qos(manifest),
    )
    scorer = LearnedScorer(network, encoder, rule, manifest, digest, str(path))
    if prior_only:
        scorer.name = "ppo-prior"
    else:
        scorer.delay_head = DelayHead.from_model(params, manifest)
    return scorer
