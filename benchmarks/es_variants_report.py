"""The adaptation table of docs/ppo.md from fine-tuning runs and their evaluations.

    rlsched train --exp-name half --nodes variants/half.json --pods openb_pod_list_default.csv \\
        --init policy/models/ppo-openb-default.npz --max-minutes 30 --out-dir runs/adapt --export runs/adapt/half.npz
    P=ppo:runs/adapt/half.npz,ppo-prior:runs/adapt/half.npz,ppo-prior:policy/models/ppo-openb-default.npz
    rlsched evaluate --nodes variants/half.json --pods openb_pod_list_default.csv --seeds 42-51 \\
        --policy $P,fgd-cpu,fgd --json runs/adapt/eval-half.json
    python benchmarks/es_variants_report.py half=runs/adapt/half-s1:runs/adapt/eval-half.json [more ...] \\
        --out docs/es-fine-tune-variants.json

Each argument is ``NAME=RUN_DIR:EVAL_JSON[+EVAL_JSON...]``: the run directory of ``rlsched train
--method es`` (its ``metrics.jsonl`` and exported ``best.json`` manifest) and evaluations that
together hold, on the same seeds, the fine-tuned model (``ppo:`` of a file whose manifest is the
run's), its network zeroed (``ppo-prior:`` of it), the hand rule (``ppo-prior:`` of the start model),
``fgd-cpu`` and ``fgd``. Prints the Markdown table — medians, and per seed how often the fine-tuned
model is better than each of the others — and writes every figure to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

COLUMNS = ("fine-tuned", "network zeroed", "hand rule", "fgd-cpu", "fgd")


def per_seed(evals: list[Path]) -> dict[str, dict[int, float]]:
    """policy → seed → unallocated GPU % at 100 % arrival, from ``rlsched evaluate --json`` files; they
    must be of one setup (node list, pod list, inflation), or a later file's seeds would overwrite an
    earlier one's under the same policy name. A policy and seed in two files must agree."""
    out: dict[str, dict[int, float]] = {}
    setup = None
    for path in evals:
        evaluation = json.loads(path.read_text())
        this = {k: evaluation.get(k) for k in ("nodes", "pods", "inflation_target")}
        if setup is None:
            setup = (path, this)
        elif this != setup[1]:
            raise SystemExit(f"{path} evaluates another setup ({this}) than {setup[0]} ({setup[1]})")
        for run in evaluation["runs"]:
            seeds = out.setdefault(run["policy"], {})
            seed, value = int(run["seed"]), float(run["unallocated_gpu_pct_at_100"])
            if seeds.get(seed, value) != value:
                raise SystemExit(f"{path}: {run['policy']} seed {seed} is {value}, another file says {seeds[seed]}")
            seeds[seed] = value
    return out


def columns(runs: dict[str, dict[int, float]], manifest: dict[str, Any]) -> dict[str, dict[int, float]]:
    """The five columns out of the evaluated policies: the fine-tuned model is the ``ppo:`` file whose
    manifest has the run's version; the hand rule is ``ppo-prior:`` of the start model."""
    version, start = manifest["version"], manifest["training"]["init"]["path"]
    found: dict[str, dict[int, float]] = {}
    for policy, values in runs.items():
        prefix, _, path = policy.partition(":")
        if prefix in ("ppo", "ppo-prior") and Path(path).resolve() != Path(start).resolve():
            sidecar = Path(path).with_suffix(".json")
            if sidecar.exists() and json.loads(sidecar.read_text()).get("version") == version:
                found["fine-tuned" if prefix == "ppo" else "network zeroed"] = values
        elif prefix == "ppo-prior" and Path(path).resolve() == Path(start).resolve():
            found["hand rule"] = values
        elif policy in ("fgd-cpu", "fgd"):
            found[policy] = values
    missing = [c for c in COLUMNS if c not in found]
    if missing:
        raise SystemExit(f"the evaluations lack {', '.join(missing)} (version {version}, start {start})")
    return found


def variant(run_dir: Path, evals: list[Path]) -> dict[str, Any]:
    manifest = json.loads((run_dir / "best.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    cols = columns(per_seed(evals), manifest)
    seeds = sorted(set.intersection(*(set(v) for v in cols.values())))
    mine = np.array([cols["fine-tuned"][s] for s in seeds])
    against = {}
    for name in COLUMNS[1:]:
        diff = mine - np.array([cols[name][s] for s in seeds])
        against[name] = {
            "better": int((diff < 0).sum()),
            "worse": int((diff > 0).sum()),
            "medianDifference": round(float(np.median(diff)), 4),
        }
    training = manifest["training"]
    return {
        "seconds": rows[-1].get("seconds"),
        "workers": training["args"]["workers"],
        "iterations": training["iterations"],
        "bestIteration": training["bestIteration"],
        "rankScale": manifest["decision"]["rankScale"],
        "confirmation": training.get("confirmation"),
        "validation": [{k: r[k] for k in ("iteration", "val", "rank_scale", "head_l1")} for r in rows if "val" in r],
        "medians": {name: round(float(np.median([cols[name][s] for s in seeds])), 4) for name in COLUMNS},
        "fineTunedAgainst": against,
        "seeds": seeds,
        "evaluation": {name: {str(s): cols[name][s] for s in seeds} for name in COLUMNS},
    }


def table(report: dict[str, dict[str, Any]]) -> str:
    def cell(a: dict[str, Any]) -> str:
        worse = f", worse on {a['worse']}" if a["worse"] else ""
        return f"{a['better']}{worse} ({a['medianDifference']:+.2f})"

    lines = [
        "| variant | " + " | ".join(COLUMNS) + " | fine-tuned better than: " + " / ".join(COLUMNS[1:]) + " |",
        "|---|" + "---:|" * len(COLUMNS) + "---|",
    ]
    for name, v in report.items():
        lowest = min(f"{x:.2f}" for x in v["medians"].values())
        shown = [f"{v['medians'][c]:.2f}" for c in COLUMNS]
        cells = [f"**{x}**" if x == lowest else x for x in shown]
        lines.append(
            f"| {name} | "
            + " | ".join(cells)
            + " | "
            + " / ".join(cell(v["fineTunedAgainst"][c]) for c in COLUMNS[1:])
            + " |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variants", nargs="+", metavar="NAME=RUN_DIR:EVAL_JSON[+EVAL_JSON...]")
    parser.add_argument("--out", help="write every figure here (JSON)")
    parser.add_argument("--about", default="", help="a sentence stored with the figures (machine, commands)")
    args = parser.parse_args(argv)
    report: dict[str, dict[str, Any]] = {}
    for spec in args.variants:
        name, sep, rest = spec.partition("=")
        run_dir, sep2, evals = rest.partition(":")
        if not (sep and sep2 and name and run_dir and evals):
            print(f"bad argument {spec!r}: want NAME=RUN_DIR:EVAL_JSON[+EVAL_JSON...]", file=sys.stderr)
            return 2
        report[name] = variant(Path(run_dir), [Path(p) for p in evals.split("+")])
    print(table(report))
    if args.out:
        Path(args.out).write_text(json.dumps({"about": args.about, "variants": report}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
