"""The objective's trade-off over β, from living-cluster evaluations already run.

    rlsched evaluate --mode dynamic ... --json runs/a.json      # any number of these, same seeds
    python benchmarks/objective_beta_curve.py runs/a.json [runs/b.json ...] --out docs/dynamic-beta

``rlsched evaluate --mode dynamic`` writes every run's measures (mean wait, cost %, hot-node %,
stranded %). The objective ``−(β·wait/latency scale + (1−β)·cost + w_sla·hot + w_stranded·stranded)``
weighs them; this script recomputes it for each β (other weights from ``--objective-from``, a
SchedulingPolicy file, else the defaults) and prints, per β, each policy's median over seeds, the
best policy and how many seeds it wins against the runner-up. It does not retrain anything: a
learned policy keeps the weights it was trained with, so the curve says which of the *given*
policies a cluster with that β should serve. Runs are paired by seed (common random numbers): only
the seeds every policy has are compared, and a seed some policy lacks is left out with a warning (use
``--exclude`` to drop a policy instead). When no seed is shared by all policies it stops with an error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from rlsched.policy.dynamic.objective import objective_of
from rlsched.policy.dynamic.objective_spec import Objective, read_objective


def load_runs(paths: list[Path], exclude: list[str]) -> dict[str, dict[int, dict[str, Any]]]:
    """policy → seed → run, from ``rlsched evaluate --mode dynamic`` JSON files (a later file wins)."""
    runs: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for path in paths:
        for run in json.loads(path.read_text())["runs"]:
            if not any(x in run["policy"] for x in exclude):
                runs[run["policy"]][int(run["seed"])] = run
    return dict(runs)


def curve(
    runs: dict[str, dict[int, dict[str, Any]]], betas: list[float], objective: Objective
) -> tuple[list[int], list[dict[str, Any]]]:
    """The seeds every policy has, and per β: median objective per policy, the best, its wins."""
    seeds = sorted(set.intersection(*(set(by_seed) for by_seed in runs.values())))
    if not seeds:
        have = "; ".join(f"{p}: {seed_range(by_seed)}" for p, by_seed in sorted(runs.items()))
        raise ValueError(f"no seed is in every policy's runs ({have}): pair runs of the same seeds, or --exclude one")
    for policy, by_seed in runs.items():
        if set(by_seed) != set(seeds):
            print(
                f"warning: {policy}: seeds {sorted(set(by_seed) - set(seeds))} not in every policy's runs",
                file=sys.stderr,
            )
    rows = []
    for beta in betas:
        weights = dataclasses.replace(objective.weights, beta=beta)
        per = {p: np.array([objective_of(by_seed[s], weights) for s in seeds]) for p, by_seed in runs.items()}
        medians = {p: float(np.median(v)) for p, v in per.items()}
        ranked = sorted(medians, key=lambda p: -medians[p])
        best, second = ranked[0], ranked[1] if len(ranked) > 1 else ranked[0]
        ablation = {  # a learned model against itself with the network zeroed (ppo-prior:), seed by seed
            p: [int((per[p] > per[prior]).sum()), int((per[p] < per[prior]).sum())]
            for p in per
            if p.startswith("ppo:") and (prior := "ppo-prior:" + p[len("ppo:") :]) in per
        }
        rows.append(
            {
                "beta": beta,
                "median": medians,
                "best": best,
                "runner_up": second,
                "best_wins": int((per[best] > per[second]).sum()),
                "best_losses": int((per[best] < per[second]).sum()),
                "learned_vs_prior": ablation,
            }
        )
    return seeds, rows


def seed_range(by_seed: dict[int, Any]) -> str:
    """``"seeds 42–51 (10)"``: the span and count of a policy's seeds, for messages."""
    seeds = sorted(by_seed)
    return f"seeds {seeds[0]}–{seeds[-1]} ({len(seeds)})" if seeds else "no seeds"


def short(policy: str) -> str:
    """``ppo:path/to/model.npz`` → ``ppo:model``."""
    head, _, path = policy.partition(":")
    return f"{head}:{Path(path).stem}" if path else policy


def table(rows: list[dict[str, Any]], policies: list[str]) -> str:
    learned = sorted(rows[0]["learned_vs_prior"]) if rows else []
    head = "| β | " + " | ".join(short(p) for p in policies) + " | best | runner-up | best's wins/losses vs it |"
    head += "".join(f" {short(p)} vs its prior, wins/losses |" for p in learned)
    lines = [head, "|" + "---:|" * (len(policies) + 1) + "---|---|---:|" + "---:|" * len(learned)]
    for r in rows:
        cells = [f"{100 * r['median'][p]:.2f}" for p in policies]
        tail = f"{short(r['best'])} | {short(r['runner_up'])} | {r['best_wins']}/{r['best_losses']}"
        tail += "".join(" | {}/{}".format(*r["learned_vs_prior"][p]) for p in learned)
        lines.append(f"| {r['beta']:.2f} | " + " | ".join(cells) + f" | {tail} |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], policies: list[str], path: Path, reference: str) -> None:
    """Each policy's median objective minus ``reference``'s at the same β: the objective itself moves
    with β for every policy alike (the cost term), which would hide the differences."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    betas = [r["beta"] for r in rows]
    for p in policies:
        ax.plot(betas, [100 * (r["median"][p] - r["median"][reference]) for r in rows], marker="o", label=short(p))
    ax.set_xlabel("β (weight of latency against cost)")
    ax.set_ylabel(f"median objective − {short(reference)}'s, × 100")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="JSON files of rlsched evaluate --mode dynamic")
    ap.add_argument("--betas", default="0,0.25,0.5,0.75,1", help="comma-separated β values (default: %(default)s)")
    ap.add_argument("--objective-from", metavar="FILE", help="SchedulingPolicy whose spec.objective sets the weights")
    ap.add_argument("--exclude", action="append", default=[], help="leave out policies whose name contains this")
    ap.add_argument("--out", type=Path, help="write OUT.json, OUT.md and OUT.png")
    ap.add_argument("--reference", default="fgd", help="the plot shows objectives relative to this policy's")
    args = ap.parse_args(argv)
    try:
        objective = read_objective(args.objective_from) if args.objective_from else Objective()
        betas = [float(b) for b in args.betas.split(",") if b.strip()]
        if not betas or not all(0 <= b <= 1 for b in betas):
            raise ValueError(f"--betas: each β must be from 0 to 1, got {args.betas!r}")
        runs = load_runs(args.runs, args.exclude)
        if len(runs) < 2:
            raise ValueError("need runs of at least two policies")
        seeds, rows = curve(runs, betas, objective)
    except (OSError, ValueError, KeyError) as exc:
        print(f"objective_beta_curve: {exc}", file=sys.stderr)
        return 2
    policies = sorted(runs)
    text = table(rows, policies)
    print(
        f"median objective × 100 over seeds {seeds[0]}–{seeds[-1]} ({len(seeds)} seeds); weights {objective.to_spec()}"
    )
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "seeds": seeds,
            "objective": objective.to_spec(),
            "inputs": [str(p) for p in args.runs],
            "rows": rows,
        }
        args.out.with_suffix(".json").write_text(json.dumps(payload, indent=1) + "\n")
        title = f"# The combined objective over β: median × 100 over seeds {seeds[0]}–{seeds[-1]}"
        args.out.with_suffix(".md").write_text(f"{title}\n\n{text}\n")
        plot(rows, policies, args.out.with_suffix(".png"), args.reference if args.reference in runs else policies[0])
        print(f"wrote {args.out.with_suffix('.json')}, .md and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
