"""The ``rlsched`` command line: ``rlsched train | evaluate | extender | operator``.

Each sub-command lives next to the code it drives and provides ``add_arguments(parser)`` and
``run(args) -> int``; heavy imports (torch, aiohttp, kopf) happen inside ``run`` so that
``rlsched --help`` stays fast and serving images without torch still work.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__

COMMANDS: dict[str, tuple[str, str]] = {
    "train": (
        "rlsched.policy.cli_train",
        "train a placement policy (PPO, torch) or fine-tune one for a cluster (evolution strategies) and export it",
    ),
    "evaluate": ("rlsched.policy.cli_evaluate", "run policies through the FGD-protocol simulator and report"),
    "train-rebalancer": (
        "rlsched.policy.cli_train_rebalancer",
        "learn the rebalancer's move weights in the living-cluster simulation",
    ),
    "train-delay": (
        "rlsched.policy.cli_train_delay",
        "learn a model's delay head (when to hold a pod back) in the living-cluster simulation",
    ),
    "extender": ("rlsched.extender.cli", "run the kube-scheduler extender (filter/prioritize/bind/preempt)"),
    "operator": (
        "rlsched.operator.cli",
        "run the operator: SchedulingPolicy rollout, requeue of delayed pods, decision log",
    ),
}
"""Sub-command → (module, one-line help)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlsched", description="kube-rl-scheduler: learned GPU-aware pod placement for Kubernetes"
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        cmd.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(cmd)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return 2
    return int(importlib.import_module(args._module).run(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
