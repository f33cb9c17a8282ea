"""The install and uninstall commands of docs/install.md and the README, as a user pastes them:

- the helm install runs the kube-scheduler of the cluster's version (`--set scheduler.image.tag=$KUBE`,
  with the README's KUBE line): the chart's default v1.37.2 never turns Ready against an API server
  older than 1.34;
- SchedulingPolicies go first, while the operator runs: the served one carries the operator's
  finalizer, so deleting the namespace (or the CRD) before it would hang for ever;
- the CRD removal leaves kopf's peering CRDs alone: other kopf operators share them.

NOTES.txt gives the same first uninstall step, for the release's namespace.
"""

from __future__ import annotations

import re
from pathlib import Path

from test_chart_images_and_notes import rendered_notes
from test_chart_sync import REPO, needs_helm

INSTALL = (REPO / "docs" / "install.md").read_text()
README = (REPO / "README.md").read_text()
KUBE_LINE = re.compile(r"^\s*(KUBE=\$\(kubectl version \| .*\))", re.M)


def shell_blocks(text: str) -> list[str]:
    """The ```sh blocks of a Markdown text, with backslash continuations joined."""
    return [b.replace("\\\n", " ") for b in re.findall(r"```sh\n(.*?)```", text, re.S)]


def commands(text: str) -> list[str]:
    """Every shell command line of the ```sh blocks, comments stripped."""
    return [ln.split("   #")[0].strip() for b in shell_blocks(text) for ln in b.splitlines() if ln.strip()]


def test_helm_install_runs_the_clusters_kube_scheduler() -> None:
    for doc in (INSTALL, README):
        installs = [c for c in commands(doc) if c.startswith("helm install rl-scheduler oci://$REGISTRY")]
        assert installs and all("--set scheduler.image.tag=$KUBE" in c for c in installs), installs
    (readme_kube,) = KUBE_LINE.findall(README)
    assert KUBE_LINE.findall(INSTALL) == [readme_kube]  # the same line: both paste the same way


def test_policies_are_deleted_before_the_operator_and_the_namespace() -> None:
    lines = commands(INSTALL)
    first = "kubectl delete schedulingpolicies --all -n rlsched-system --wait"
    for last in ("helm uninstall rl-scheduler", "manifests/00-namespace.yaml"):
        (at,) = [i for i, c in enumerate(lines) if last in c and c.startswith(("helm uninstall", "kubectl delete"))]
        assert at > 0 and lines[at - 1] == first, lines[at - 1 : at + 1]


def test_crd_removal_leaves_kopfs_shared_crds() -> None:
    removals = [c for c in commands(INSTALL) if c.startswith("kubectl delete crd")]
    assert removals == ["kubectl delete crd schedulingpolicies.rlsched.io"]


@needs_helm
def test_notes_say_how_to_delete_the_policies_before_uninstalling(tmp_path: Path) -> None:
    notes = rendered_notes(tmp_path)
    assert "kubectl delete schedulingpolicies --all -n rlsched-system --wait" in notes
