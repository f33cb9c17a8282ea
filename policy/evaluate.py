"""``rlsched evaluate``: run policies over seeds with the FGD protocol and report table, JSON and PNG.

Each (policy, seed) pair is one :func:`~rlsched.policy.simulator.run_fgd_protocol` run; runs are
independent, so ``jobs > 1`` spreads them over processes.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .cluster import ClusterState, NodeSpec, PodSpec
from .feasibility import feasible_mask
from .published import TOLERANCE_PP, published, published_setup, trace_name
from .resources import clip
from .scorers import UnknownPolicyError, canonical_name
from .simulator import RunResult, run_fgd_protocol
from .trace import load_nodes, load_pods
from .typical import TypicalPods, typical_pods
from .workload import DEFAULT_TARGET, check_inflatable, target_problem

if TYPE_CHECKING:
    from .events import EventRunResult


MAX_SEEDS = 100_000
"""Seeds in one ``--seeds`` list at most this (a run takes a second or more each: 100,000 are days)."""

PUBLISHED_SEEDS = tuple(range(42, 52))
"""The seeds the published medians (:mod:`rlsched.policy.published`) are taken over: a run is judged
against them (ok/MISS, ``within_tolerance``) only when it played exactly these seeds. A median over other
seeds, or fewer, is another statistic: the published figure is then shown as a reference only."""


def parse_seeds(text: str) -> list[int]:
    """``"42-51"``, ``"1,5,9"`` or ``"42-45,50"`` → a list of seeds (order kept, no repeats), at most
    MAX_SEEDS of them: a range is measured before it is expanded (``1-10**18`` would never finish)."""
    seeds: dict[int, None] = {}  # insertion-ordered set: a membership test per seed, not a scan
    for part in text.split(","):
        part = part.strip()
        match = re.fullmatch(r"0*(\d{1,19})(?:-0*(\d{1,19}))?", part)  # zeros in front are no digits
        if not match:
            raise ValueError(
                f"bad seed list {clip(text)}: expected numbers (up to 19 digits) and ranges like '42-51' or '1,5,9'"
            )
        lo = int(match.group(1))
        hi = int(match.group(2)) if match.group(2) else lo
        if hi < lo:
            raise ValueError(f"bad seed range {part!r}: the end is below the start")
        if hi - lo >= MAX_SEEDS:
            raise ValueError(f"bad seed range {part!r}: more than {MAX_SEEDS:,} seeds")
        seeds.update(dict.fromkeys(range(lo, hi + 1)))
        if len(seeds) > MAX_SEEDS:
            raise ValueError(f"bad seed list: more than {MAX_SEEDS:,} seeds")
    return list(seeds)


def parse_policies(text: str) -> list[str]:
    """``"fgd,BestFit,ppo:model.npz"`` → canonical names; unknown names raise with the choices."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if part.startswith(("ppo:", "ppo-prior:")):
            path = part.split(":", 1)[1]
            if not Path(path).exists():
                raise UnknownPolicyError(f"policy {part!r}: model file {path!r} does not exist")
            out.append(part)
        else:
            out.append(canonical_name(part))
    if not out:
        raise UnknownPolicyError("no policy given")
    return list(dict.fromkeys(out))  # one row per policy: "fgd,FGD" ran it twice into one row of 2× seeds


@dataclass
class PolicySummary:
    """Aggregates of one policy over the seeds."""

    policy: str
    seeds: int
    unallocated_100: list[float]
    unallocated_130: list[float]
    failed_pods: list[int]
    frag_100: list[float]
    seconds: list[float]
    published_100: float | None = None
    short_of_100: dict[int, int] = field(default_factory=dict)
    """Seed → the arrived GPU % its arrivals stopped at, for the seeds whose arrivals never reached 100 %
    (:func:`arrivals_short_of_100`): their "at 100" figures were read at that point instead."""
    not_read_at_100: dict[int, dict[str, int | None]] = field(default_factory=dict)
    """Seed → where its "at 100" figures were read (``unallocated_at``: the curve point of "unalloc@100";
    ``frag_at``: where "frag@100" was measured), for the seeds where either is not 100 %: arrivals that
    stopped short of it, or one pod that took them over it (:func:`figures_not_at_100`)."""
    not_read_at_130: dict[int, int | None] = field(default_factory=dict)
    """Seed → the curve point "unalloc@130" was read at, for the seeds whose curve has no point at 130 %
    (:func:`figures_not_at`)."""
    seed_list: tuple[int, ...] = ()
    """The seeds played, in order (the published verdict needs :data:`PUBLISHED_SEEDS`)."""

    @staticmethod
    def _stats(values: Sequence[float]) -> dict[str, Any]:
        arr = np.asarray(values, dtype=float)
        return {
            "median": float(np.median(arr)),
            "p25": float(np.percentile(arr, 25)),
            "p75": float(np.percentile(arr, 75)),
            "min": float(arr.min()),
            "max": float(arr.max()),
        }

    @property
    def median_100(self) -> float:
        return float(np.median(self.unallocated_100))

    @property
    def judged(self) -> bool:
        """Whether the median is judged against the published figure: there is one, and the seeds played
        are exactly those it is a median over (:data:`PUBLISHED_SEEDS`)."""
        return self.published_100 is not None and sorted(self.seed_list) == list(PUBLISHED_SEEDS)

    @property
    def within_tolerance(self) -> bool | None:
        """The verdict against the published figure; None when there is none to give (:attr:`judged`)."""
        if self.published_100 is None or not self.judged:
            return None
        return abs(self.median_100 - self.published_100) <= TOLERANCE_PP.get(self.policy, 0.5)

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "seeds": self.seeds,
            "unallocated_gpu_pct_at_100": self._stats(self.unallocated_100),
            "unallocated_gpu_pct_at_130": self._stats(self.unallocated_130),
            "failed_pods": self._stats(self.failed_pods),
            "frag_pct_at_100": self._stats(self.frag_100),
            "seconds_per_run": self._stats(self.seconds),
            "published_median_at_100": self.published_100,
            "within_tolerance": self.within_tolerance,
            "arrivals_short_of_100": {str(seed): pct for seed, pct in self.short_of_100.items()},
            "not_read_at_100": {str(seed): points for seed, points in self.not_read_at_100.items()},
            "not_read_at_130": {str(seed): point for seed, point in self.not_read_at_130.items()},
        }


@dataclass
class Evaluation:
    """All runs of one evaluation."""

    nodes_path: str
    pods_path: str
    target: float
    runs: list[RunResult] = field(default_factory=list)
    published_setup: str | None = None
    """The published trace these node and pod lists are (by content), else None: no published column."""
    models: dict[str, dict[str, str]] = field(default_factory=dict)
    """Learned policy → its model file's sha256 and version (:func:`model_identities`)."""

    def summaries(self) -> list[PolicySummary]:
        by_policy: dict[str, list[RunResult]] = {}
        for run in self.runs:
            by_policy.setdefault(run.policy, []).append(run)
        out = []
        for policy, runs in by_policy.items():
            out.append(
                PolicySummary(
                    policy=policy,
                    seeds=len(runs),
                    unallocated_100=[r.unallocated_at(100) for r in runs],
                    unallocated_130=[r.unallocated_at(130) for r in runs],
                    failed_pods=[r.failed_pods for r in runs],
                    frag_100=[r.frag_at_100 for r in runs],
                    seconds=[r.seconds for r in runs],
                    published_100=published(self.published_setup, policy),
                    short_of_100=arrivals_short_of_100(runs),
                    not_read_at_100=figures_not_at_100(runs),
                    not_read_at_130=figures_not_at(runs, 130),
                    seed_list=tuple(r.seed for r in runs),
                )
            )
        return out

    def median_curves(self) -> dict[str, dict[int, float]]:
        """Policy → arrived % → median over seeds of the allocated %."""
        out: dict[str, dict[int, float]] = {}
        for policy in dict.fromkeys(r.policy for r in self.runs):
            runs = [r for r in self.runs if r.policy == policy]
            xs = sorted(set().union(*(r.curve for r in runs)))
            out[policy] = {x: float(np.median([r.allocated_at(x) for r in runs])) for x in xs}
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes_path,
            "pods": self.pods_path,
            "trace": trace_name(self.pods_path),
            "published_setup": self.published_setup,
            "inflation_target": self.target,
            "models": self.models,
            "summary": [
                {
                    **s.to_json(),
                    "versus_first": (
                        None
                        if s.policy == self.runs[0].policy
                        else paired_difference(self, s.policy, self.runs[0].policy).to_json()
                    ),
                }
                for s in self.summaries()
            ],
            "runs": [
                {
                    **r.summary(),
                    "arrived_pct_max": arrived_pct_max(r),
                    "read_at": {
                        "unallocated_gpu_pct_at_100": r.read_at(100),
                        "unallocated_gpu_pct_at_130": r.read_at(130),
                        "frag_pct_at_100": r.frag_read_at,
                    },
                    "curve": {str(k): round(v, 4) for k, v in r.curve.items()},
                }
                for r in self.runs
            ],
        }


def arrived_pct_max(run: RunResult) -> int:
    """The arrived GPU % (of capacity) a run's arrivals ended at: the last point of its curve."""
    return max(run.curve) if run.curve else 0


def arrivals_short_of_100(runs: Iterable[RunResult]) -> dict[int, int]:
    """Seed → where its arrivals stopped, for the runs whose arrivals never reached 100 % of GPU capacity.

    Inflation stops at the first drawn pod that would pass the target, so a workload of pods large
    against the cluster (a 12-card pod on 18 cards) can stop well short of 100 %, whatever the target.
    Such a run's "at 100" figures are read at its last point; the table and the JSON say so rather
    than print them as if they were measured at 100 %."""
    return {r.seed: arrived_pct_max(r) for r in runs if arrived_pct_max(r) < 100}


def figures_not_at(runs: Iterable[RunResult], pct: int) -> dict[int, int | None]:
    """Seed → the curve point a figure "at ``pct`` %" is read from (:meth:`RunResult.read_at`), for the
    runs whose curve has no point at ``pct``: their arrivals ended below it, or one pod took them over it
    (a 12-card pod on 18 cards moves them 67 points), and the figure is the nearest point below. The table
    marks such figures and the JSON lists them, rather than print them as if they were measured there."""
    return {r.seed: r.read_at(pct) for r in runs if pct not in r.curve}


def figures_not_at_100(runs: Iterable[RunResult]) -> dict[int, dict[str, int | None]]:
    """Seed → where its "unalloc@100" (``unallocated_at``) and "frag@100" (``frag_at``) were read, for the
    runs where either is not 100 %. Fragmentation is measured once, at the first pod event at 100 % or
    past it, so a run whose curve jumps over 100 % reads "unalloc@100" just below and "frag@100" just
    above; one that never reaches 100 % reads both at its last point."""
    out: dict[int, dict[str, int | None]] = {}
    for r in runs:
        if 100 not in r.curve or r.frag_read_at not in (100, None):  # None: not known (a result built by hand)
            out[r.seed] = {"unallocated_at": r.read_at(100), "frag_at": r.frag_read_at}
    return out


def paired_unallocated(evaluation: Evaluation, policy: str) -> dict[int, float]:
    """Seed → unallocated GPU % at 100 % arrival of ``policy``, rounded as reported (4 decimals)."""
    return {r.seed: round(r.unallocated_at(100), 4) for r in evaluation.runs if r.policy == policy}


@dataclass(frozen=True)
class PairedDifference:
    """``policy`` against ``baseline`` on the seeds both played: unallocated GPU % at 100 % arrival,
    policy minus baseline, seed by seed (negative: the policy left less GPU unallocated).

    Seeds counted, and the mean with its standard error: an effect of 0.01 points is invisible in ten
    seeds' win counts and resolved by 60 (docs/ppo.md, "What has been tried since")."""

    better: int
    worse: int
    equal: int
    mean: float | None
    """Mean of the differences; None without a common seed."""
    standard_error: float | None
    """Sample standard deviation of the differences / √seeds; None below two common seeds."""

    def to_json(self) -> dict[str, Any]:
        return {
            "better": self.better,
            "worse": self.worse,
            "equal": self.equal,
            "mean_difference": None if self.mean is None else round(self.mean, 4),
            "standard_error": None if self.standard_error is None else round(self.standard_error, 4),
        }


def paired_difference(evaluation: Evaluation, policy: str, baseline: str) -> PairedDifference:
    mine, base = paired_unallocated(evaluation, policy), paired_unallocated(evaluation, baseline)
    diffs = np.array([mine[seed] - base[seed] for seed in mine if seed in base])
    better, worse = int((diffs < 0).sum()), int((diffs > 0).sum())
    return PairedDifference(
        better=better,
        worse=worse,
        equal=len(diffs) - better - worse,
        mean=float(diffs.mean()) if len(diffs) else None,
        standard_error=float(diffs.std(ddof=1) / np.sqrt(len(diffs))) if len(diffs) >= 2 else None,
    )


def format_table(evaluation: Evaluation) -> str:
    """A plain-text table: one row per policy, with its paired difference from the first policy (mean
    ± standard error, and seeds better/worse/equal; lower unallocated GPU is better; the same seed is
    the same arrivals and tie-break order)."""
    rows = [
        (
            "policy",
            "unalloc@100 med [min-max]",
            "unalloc@130 med",
            "failed pods med",
            "frag@100 med",
            "published@100",
            "s/run",
            "mean diff vs first ± se",
            "seeds better/worse/equal vs first",
        )
    ]
    summaries = evaluation.summaries()
    for s in summaries:
        mean, versus = "-", "-"
        if s.policy != evaluation.runs[0].policy:
            paired = paired_difference(evaluation, s.policy, evaluation.runs[0].policy)
            versus = f"{paired.better}/{paired.worse}/{paired.equal}"
            if paired.mean is not None:
                mean = f"{paired.mean:+.4f}"
            if paired.standard_error is not None:
                mean += f" ± {paired.standard_error:.4f}"
        pub = "-"
        if s.published_100 is not None:
            mark = ("ok" if s.within_tolerance else "MISS") if s.judged else REFERENCE_MARK
            pub = f"{s.published_100:.2f} ({s.median_100 - s.published_100:+.2f} {mark})"
        off_100 = list(s.not_read_at_100.values())
        short = SHORT_MARK if any(p["unallocated_at"] != 100 for p in off_100) else ""
        frag_short = SHORT_MARK if any(p["frag_at"] not in (100, None) for p in off_100) else ""
        short_130 = SHORT_MARK if s.not_read_at_130 else ""
        rows.append(
            (
                s.policy,
                f"{s.median_100:6.2f} [{min(s.unallocated_100):.2f}-{max(s.unallocated_100):.2f}]{short}",
                f"{np.median(s.unallocated_130):6.2f}{short_130}",
                f"{np.median(s.failed_pods):7.0f}",
                f"{np.median(s.frag_100):6.2f}{frag_short}",
                pub,
                f"{np.median(s.seconds):.2f}",
                mean,
                versus,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.extend(
        f"{policy}: model sha256 {m['sha256'][:16]}, version {m['version'] or '-'}"
        for policy, m in evaluation.models.items()
    )
    lines.extend(reading_notes(summaries))
    if any(s.published_100 is not None and not s.judged for s in summaries):
        first, last = PUBLISHED_SEEDS[0], PUBLISHED_SEEDS[-1]
        lines.append(
            f"published@100 ({REFERENCE_MARK}): the paper's median over seeds {first}-{last}, shown for reference; "
            "the ok/MISS verdict is given only for runs of exactly those seeds"
        )
    return "\n".join(lines)


SHORT_MARK = " *"
"""Appended to an "unalloc@100", "frag@100" or "unalloc@130" cell some of whose runs have no point at
that arrived %, so that the figure was read elsewhere (:func:`reading_notes` says where)."""
REFERENCE_MARK = "ref"
"""In the published@100 cell instead of ok/MISS when the seeds played are not :data:`PUBLISHED_SEEDS`."""


def _span(points: Iterable[int | None]) -> str:
    """``"69 %"`` or ``"63-69 %"`` over the known points (``"0 %"`` stands for none: no arrival yet)."""
    known = sorted({p if p is not None else 0 for p in points})
    return f"{known[0]} %" if len(known) == 1 else f"{known[0]}-{known[-1]} %"


def reading_notes(summaries: Sequence[PolicySummary]) -> list[str]:
    """The footnotes of :data:`SHORT_MARK`: per policy, the seeds whose "@100" or "@130" figures were read
    at another arrived %, and where."""
    notes = []
    for s in summaries:
        if s.short_of_100:
            where = _span(s.short_of_100.values())
            notes.append(
                f"*{s.policy}: arrivals stopped at {where} of GPU capacity in {len(s.short_of_100)} of {s.seeds} "
                'seed(s), never reaching 100 %; "@100" is read there (the pods are large against the cluster: '
                "inflation stops at the first drawn pod that would pass --target; a higher --target may reach 100 %)"
            )
        jumped = {seed: p for seed, p in s.not_read_at_100.items() if seed not in s.short_of_100}
        if jumped:
            below = _span(p["unallocated_at"] for p in jumped.values())
            above = [p["frag_at"] for p in jumped.values() if p["frag_at"] is not None]
            frag = f', and "frag@100" at {_span(above)}, the first point past it' if above else ""
            notes.append(
                f"*{s.policy}: in {len(jumped)} of {s.seeds} seed(s) one pod took the arrivals over 100 % of GPU "
                f'capacity, so there is no point at 100 %: "unalloc@100" is read at {below}, the last point '
                f"below it{frag} (pods large against the cluster)"
            )
        if s.not_read_at_130:
            notes.append(
                f'*{s.policy}: "unalloc@130" is read at {_span(s.not_read_at_130.values())}, the last point below '
                f"130 %, in {len(s.not_read_at_130)} of {s.seeds} seed(s): their arrivals have no point at 130 % "
                "(they ended below it, or one pod took them over it)"
            )
    return notes


def plot_curves(evaluation: Evaluation, path: str | Path) -> None:
    """PNG of the median allocation curves, one line per policy (like Figure 9 of the FGD paper)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for policy, curve in evaluation.median_curves().items():
        xs = [x for x in curve if x >= 50]
        label = f"{policy} ({100 - curve.get(100, float('nan')):.2f} % unallocated at 100 %)"
        ax.plot(xs, [curve[x] for x in xs], label=label, linewidth=1.4)
    ax.plot([50, 100], [50, 100], color="grey", linestyle=":", linewidth=0.8, label="ideal")
    ax.axvline(100, color="grey", linewidth=0.6)
    ax.set_xlabel("arrived GPU demand (% of cluster GPU capacity)")
    ax.set_ylabel("allocated GPUs (% of capacity)")
    name = trace_name(evaluation.pods_path) or Path(evaluation.pods_path).name
    ax.set_title(f"GPU allocation, trace {name}, median over seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# -- running ---------------------------------------------------------------------------------------


class _Workload:
    """What a worker process needs, loaded once per process."""

    nodes: Sequence[NodeSpec]
    pods: Sequence[PodSpec]
    typical: TypicalPods
    target: float


_worker: _Workload | None = None


def _init_worker(nodes: Sequence[NodeSpec], pods: Sequence[PodSpec], typical: TypicalPods, target: float) -> None:
    global _worker
    _worker = _Workload()
    _worker.nodes, _worker.pods, _worker.typical, _worker.target = nodes, pods, typical, target


def _run_one(task: tuple[str, int]) -> RunResult:
    policy, seed = task
    assert _worker is not None
    return run_fgd_protocol(_worker.nodes, _worker.pods, policy, seed, _worker.target, _worker.typical)


def evaluate(
    nodes_path: str | Path,
    pods_path: str | Path,
    policies: Sequence[str],
    seeds: Iterable[int],
    target: float = DEFAULT_TARGET,
    jobs: int = 1,
    typical_from: str | Path | None = None,
    progress: bool = True,
    warn: Callable[[str], None] | None = None,
) -> Evaluation:
    """Run every policy on every seed. ``typical_from`` takes typical pods from another pod list;
    ``warn`` is told, before the runs, about pods that fit no node even in the empty cluster
    (:func:`unplaceable_note`).

    A learned policy's model file is identified (sha256, version) before the runs and checked after
    them: every run reads it, and a file replaced meanwhile would mix two models in one column."""
    problem = target_problem(target, "target")
    if problem:
        raise ValueError(problem)
    seeds = list(seeds)  # every policy plays every seed (a generator would serve the first policy only)
    models = model_identities(policies)
    nodes = load_nodes(nodes_path)
    pods = load_pods(pods_path)
    typical = typical_pods(load_pods(typical_from) if typical_from else pods)
    check_inflatable(pods, ClusterState(nodes).gpu_milli_capacity, target)  # here, not in the worker processes
    note = unplaceable_note(nodes, pods)
    if note and warn is not None:
        warn(note)
    tasks = [(policy, seed) for policy in policies for seed in seeds]
    # The published figures hold for the published node and pod lists under the paper's inflation only.
    setup = published_setup(nodes, pods) if target == DEFAULT_TARGET and not typical_from else None
    evaluation = Evaluation(str(nodes_path), str(pods_path), target, published_setup=setup, models=models)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(tasks), desc="runs", unit="run", leave=False)
    try:
        jobs = min(jobs, len(tasks))  # no process without a run to do
        if jobs <= 1:
            _init_worker(nodes, pods, typical, target)
            for task in tasks:
                evaluation.runs.append(_run_one(task))
                if bar:
                    bar.set_postfix_str(f"{task[0]} seed {task[1]}")
                    bar.update()
        else:
            with ProcessPoolExecutor(
                max_workers=jobs, initializer=_init_worker, initargs=(nodes, pods, typical, target)
            ) as pool:
                for result in pool.map(_run_one, tasks):
                    evaluation.runs.append(result)
                    if bar:
                        bar.update()
    finally:
        if bar:
            bar.close()
    if model_identities(policies) != models:
        raise ValueError("a model file changed during the evaluation: its runs mix two models; run it again")
    return evaluation


def unplaceable_note(nodes: Sequence[NodeSpec], pods: Sequence[PodSpec]) -> str | None:
    """A line about the pods that fit no node even when the cluster is empty, with the first of them and
    why; None when every pod fits some node.

    The FGD protocol keeps such pods (they are part of the trace) and counts each arrival of one, and of
    its clones, as a failed pod, so the results stand as the protocol defines them; but a pod that can
    never run is usually a mistake in the file (``v100m32`` for ``V100M32``, more cards than any node
    has), and its failures would otherwise pass for the policy's."""
    state = ClusterState(nodes)
    verdict: dict[tuple[object, ...], bool] = {}  # pods with the same request share one check
    bad: list[PodSpec] = []
    for pod in pods:
        key = (pod.cpu_milli, pod.memory_mib, pod.num_gpu, pod.gpu_milli, pod.gpu_models)
        if key not in verdict:
            verdict[key] = bool(feasible_mask(state, state.request(pod)).any())
        if not verdict[key]:
            bad.append(pod)
    if not bad:
        return None
    first = bad[0]
    return (
        f"{len(bad)} of {len(pods)} pods fit no node even in the empty cluster (first: {clip(first.name)}, "
        f"{why_unplaceable(state, first)}); each arrival of one, clones included, counts as a failed pod"
    )


def why_unplaceable(state: ClusterState, pod: PodSpec) -> str:
    """Why ``pod`` fits no node of the empty ``state``, in the terms of the pod list's columns: the first
    of its requests that no node it may use (GPU pods: the nodes of the models it allows) can meet."""
    req = state.request(pod)
    usable = np.ones(state.num_nodes, dtype=np.bool_)
    scope = "every node's"
    if req.is_gpu:
        if not state.model_names:
            return "it asks for a GPU and no node has one"
        usable = req.model_ok[state.model_id]
        scope = "every GPU node's"
        if not usable.any():
            have = ", ".join(state.model_names[:8]) + (", …" if len(state.model_names) > 8 else "")
            return (
                f"gpu_spec {clip('|'.join(pod.gpu_models))} names no model the nodes have ({have}; names are "
                "case-sensitive)"
            )
        if req.constrained:
            scope = f"every {clip('|'.join(pod.gpu_models))} node's"
    for column, wanted, capacity in (
        ("cpu_milli", req.cpu_milli, state.cpu_cap),
        ("memory_mib", req.memory_mib, state.mem_cap),
        ("num_gpu", req.num_gpu if req.is_gpu and not req.is_share else 0, state.gpu_count),
    ):
        most = int(capacity[usable].max())
        if wanted > most:
            return f"{column} {wanted} is above {scope} ({most} at most)"
    return "no single node has its cpu, memory and GPU together"


def model_identities(policies: Sequence[str]) -> dict[str, dict[str, str]]:
    """Learned policy → the sha256 and version of its model file, as it is now."""
    from .export import read_model

    out = {}
    for policy in policies:
        if policy.startswith(("ppo:", "ppo-prior:")):
            _, manifest, sha256 = read_model(policy.split(":", 1)[1])
            out[policy] = {"sha256": sha256, "version": str(manifest.get("version", ""))}
    return out


MAX_JOBS = 256
"""Worker processes one evaluation or training may ask for (``--jobs``, ``--workers``): each holds its own
copy of the workload, so a mistyped ``100000`` would fork until memory or the process table runs out."""


def jobs_problem(jobs: int, flag: str) -> str | None:
    """Why ``jobs`` worker processes cannot be asked for (None if they can): 0 (one per core) to MAX_JOBS."""
    if not 0 <= jobs <= MAX_JOBS:
        return f"{flag} must be 0 (one per core) to {MAX_JOBS}, got {jobs}"
    return None


def default_jobs(cpu_max: str | Path = "/sys/fs/cgroup/cpu.max") -> int:
    """One process per core this process may use: the cores it may run on, and no more than its
    cgroup's CPU quota allows (a container limited to 2 CPUs on a 64-core node sees 64 cores but gets
    the time of 2; 64 processes there would only share it, each with its own copy of the workload)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path(cpu_max).read_text().split()[:2]
        if quota != "max":
            cores = min(cores, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):  # no cgroup v2 quota here (or an unreadable one): the cores decide
        pass
    return max(1, cores)


def write_outputs(
    evaluation: Evaluation, out_dir: str | Path, stem: str = "evaluation", json_path: str | Path | None = None
) -> dict[str, Path]:
    """Write ``<stem>.png`` into ``out_dir`` and the JSON to ``json_path`` (default ``out_dir/<stem>.json``);
    returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": Path(json_path) if json_path else out / f"{stem}.json", "png": out / f"{stem}.png"}
    paths["json"].parent.mkdir(parents=True, exist_ok=True)
    paths["json"].write_text(json.dumps(evaluation.to_json(), indent=1))
    plot_curves(evaluation, paths["png"])
    return paths


def evaluate_events(
    nodes_path: str | Path,
    pods_path: str | Path,
    policies: Sequence[str],
    seeds: Iterable[int],
    retry_failed: bool = False,
    typical_from: str | Path | None = None,
) -> list[EventRunResult]:
    """Event-driven replays (creation/deletion times) of every policy on every seed."""
    from .events import run_events
    from .scorers import make_scorer

    nodes = load_nodes(nodes_path)
    pods = load_pods(pods_path)
    typical = typical_pods(load_pods(typical_from) if typical_from else pods)
    return [
        run_events(nodes, pods, make_scorer(policy, typical), seed, typical, retry_failed, policy)
        for policy in policies
        for seed in seeds
    ]


def format_events_table(results: Sequence[EventRunResult]) -> str:
    """Medians over seeds per policy for event-driven replays."""
    rows = [("policy", "runs", "mean alloc GPU %", "peak alloc GPU %", "mean frag %", "failed pods", "mean wait s")]
    for policy in dict.fromkeys(r.policy for r in results):
        rs = [r for r in results if r.policy == policy]

        def med(attr: str, rs: list[EventRunResult] = rs) -> float:
            return float(np.median([getattr(r, attr) for r in rs]))

        rows.append(
            (
                policy,
                str(len(rs)),
                f"{med('mean_allocated_gpu_pct'):.3f}",
                f"{med('peak_allocated_gpu_pct'):.3f}",
                f"{med('mean_frag_pct'):.3f}",
                f"{med('failed_pods'):.0f}",
                f"{med('mean_wait_seconds'):.1f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
