"""The learned policy against the six FGD-paper baselines, FGD-CPU and its own hand rule on every openb trace.

    python benchmarks/ppo_table.py --data "$OPENB" --model policy/models/ppo-openb-default.npz

Median unallocated GPU % at 100 % arrival over seeds 42–51 (the FGD protocol, as ``rlsched evaluate``
runs it: the policy served through ``make_scorer("ppo:PATH")`` and ``decide()``, exactly as the
extender would). "hand rule" is ``ppo-prior:PATH``, the same model with its network's output zeroed
(its prior and decision rule alone): the last column counts the seeds on which the learned model is
better and worse than it — what learning adds, trace by trace. Traces the model was trained on (from
its manifest) are marked. Writes a Markdown table and a JSON file with every statistic.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from rlsched.policy.evaluate import default_jobs, evaluate, parse_seeds
from rlsched.policy.export import read_model
from rlsched.policy.learned import DEFAULT_MODEL
from rlsched.policy.published import POLICIES
from rlsched.policy.trace import openb_default

TRACES = [
    "default",
    "cpu050",
    "cpu200",
    "gpushare20",
    "gpushare60",
    "gpushare100",
    "gpuspec10",
    "gpuspec25",
    "multigpu20",
    "multigpu40",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="folder with the openb CSV files (default: $RLSCHED_OPENB_DIR)")
    parser.add_argument("--model", default=os.path.relpath(DEFAULT_MODEL))
    parser.add_argument("--extra", default="fgd-cpu", help="more comma-separated policies to add (default: fgd-cpu)")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--traces", default=",".join(TRACES))
    parser.add_argument("--out", default="docs/ppo-results.md")
    parser.add_argument("--jobs", type=int, default=0)
    args = parser.parse_args()
    try:
        data = Path(openb_default(args.data, "--data"))
    except ValueError as exc:
        parser.error(str(exc))
    seeds = parse_seeds(args.seeds)
    _, manifest, digest = read_model(args.model)
    trained_on = set(manifest["training"].get("traces", []))
    ppo, prior = f"ppo:{args.model}", f"ppo-prior:{args.model}"
    policies = [*POLICIES, *[p for p in args.extra.split(",") if p], prior, ppo]
    traces = [t for t in args.traces.split(",") if t]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path("runs") / f"{out.stem}.partial.json"  # git-ignored; removed when the table is written
    partial.parent.mkdir(exist_ok=True)
    results: dict[str, dict] = {}
    if partial.exists():  # a run that was stopped: keep the traces it finished for the same model and seeds
        saved = json.loads(partial.read_text())
        if saved.get("digest") == digest and saved.get("seeds") == args.seeds and saved.get("policies") == policies:
            results = {t: r for t, r in saved["results"].items() if t in traces}
            print(f"resuming: {', '.join(results) or 'nothing'} already done ({partial})", flush=True)
    started = time.time()
    for trace in traces:
        if trace in results:
            continue
        t0 = time.time()
        ev = evaluate(
            data / "openb_node_list_gpu_node.csv",
            data / f"openb_pod_list_{trace}.csv",
            policies,
            seeds,
            jobs=args.jobs or default_jobs(),
            progress=False,
        )
        results[trace] = {
            s.policy: {
                "median": s.median_100,
                "values": s.unallocated_100,
                "failed_pods_median": float(np.median(s.failed_pods)),
            }
            for s in ev.summaries()
        }
        print(
            f"{trace}: "
            + ", ".join(f"{p.split('/')[-1]} {results[trace][p]['median']:.2f}" for p in policies)
            + f"  ({time.time() - t0:.0f} s)",
            flush=True,
        )
        partial.write_text(
            json.dumps({"digest": digest, "seeds": args.seeds, "policies": policies, "results": results})
        )
    elapsed = time.time() - started

    def row(trace: str) -> str:
        r = results[trace]
        fgd = r["fgd"]["median"]
        shown = [f"{r[p]['median']:.2f}" for p in policies]
        best = min(shown, key=float)  # the lowest median of the row (as shown: ties all bold)
        cells = [f"**{x}**" if x == best else x for x in shown]
        mine = r[ppo]["median"]
        wins = sum(a < b for a, b in zip(r[ppo]["values"], r["fgd"]["values"], strict=True))
        diff = np.asarray(r[ppo]["values"]) - np.asarray(r[prior]["values"])
        learned = f"{int((diff < 0).sum())} / {int((diff > 0).sum())} ({float(np.median(diff)):+.3f})"
        mark = " (trained on)" if trace in trained_on else ""
        return f"| {trace}{mark} | " + " | ".join(cells) + f" | {mine - fgd:+.2f} | {wins}/{len(seeds)} | {learned} |"

    names = ["hand rule" if p == prior else p for p in policies[:-1]]
    header = [
        "| trace | "
        + " | ".join(names)
        + " | PPO | PPO − FGD | seeds PPO < FGD | PPO vs hand rule: seeds better / worse (median difference) |",
        "|---|" + "---|" * (len(policies) + 3),
    ]
    lines = [
        "# PPO vs the baselines (openb traces, FGD protocol)",
        "",
        f"Median unallocated GPU % at 100 % arrival over seeds {args.seeds} (lower is better). Model "
        f"`{Path(args.model).name}` version `{manifest['version']}` (sha256 `{digest[:12]}`), trained on "
        f"{', '.join(sorted(trained_on)) or '?'}; served with `make_scorer('ppo:PATH')` in "
        f"`{manifest['decision']['mode']}` mode; the lowest median of each row in bold. Generated by "
        '`python benchmarks/ppo_table.py --data "$OPENB"` in '
        f"{elapsed / 60:.1f} min on {platform.machine()} with {args.jobs or default_jobs()} worker process(es). "
        '"hand rule" is the same model with its network\'s output zeroed (`ppo-prior:PATH`).',
        "",
        "## Trained-on traces",
        "",
        *header,
        *[row(t) for t in traces if t in trained_on],
        "",
        "## Not trained on (generalization)",
        "",
        *header,
        *[row(t) for t in traces if t not in trained_on],
        "",
    ]
    out.write_text("\n".join(lines))
    out.with_suffix(".json").write_text(
        json.dumps(
            {
                "model": manifest["version"],
                "digest": digest,
                "seeds": args.seeds,
                "trainedOn": sorted(trained_on),
                "results": results,
            },
            indent=1,
        )
    )
    partial.unlink(missing_ok=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
