"""hack/release.sh run for real against fake ``podman`` and ``helm`` (no registry, no image build).

The script runs from a copy of the repository's release inputs (hack/release.sh, pyproject.toml,
helm/rl-scheduler) with no .tools/bin, so that the ``helm`` and ``podman`` it calls are the fakes on
PATH. The fake podman answers ``search --list-tags`` from $FAKE_TAGS (or fails with $FAKE_SEARCH_ERROR)
and writes a digest for ``push --digestfile``; the fake helm packages with the real helm and keeps the
chart it is asked to push. What is checked:

- the chart release.sh packages names the image it pushed (repository and digest): installing it with
  no --set renders that image, and the printed install line sets none; the source chart is unchanged;
- an appVersion tag the registry has already is refused (exit 2, one line, nothing pushed) unless
  --force; a registry that cannot be asked stops the release; a repository it does not know has no tags.

tests/e2e/test_release_e2e.py runs the script against a real registry and cluster.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "rl-scheduler"
sys.path.insert(0, str(REPO / "hack"))
sync = __import__("sync-chart")  # hack/sync-chart.py (a script, hence the dash)

HELM = sync.helm_binary()
pytestmark = pytest.mark.skipif(HELM is None, reason="helm binary missing: run hack/build-tools.sh (.tools/bin/helm)")

APP_VERSION = str(yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])
CHART_VERSION = str(yaml.safe_load((CHART / "Chart.yaml").read_text())["version"])
DIGEST = "sha256:" + "ab12" * 16
REGISTRY = "registry.example.com/team"

FAKE_PODMAN = r"""#!/usr/bin/env bash
printf '%s\n' "podman $*" >>"${FAKE_LOG}"
while [[ "$1" == --cgroup-manager=* ]]; do shift; done
case "$1" in
  search)
    if [[ -n "${FAKE_SEARCH_ERROR:-}" ]]; then printf 'Error: %s\n' "${FAKE_SEARCH_ERROR}" >&2; exit 125; fi
    repo="${*: -1}"
    printf 'NAME TAG\n'
    for t in ${FAKE_TAGS:-}; do printf '%s %s\n' "${repo}" "${t}"; done ;;
  push)
    while [[ $# -gt 0 ]]; do
      if [[ "$1" == --digestfile ]]; then printf '%s' "${FAKE_DIGEST}" >"$2"; fi
      shift
    done ;;
  image|tag) ;;
  *) echo "fake podman: unexpected $*" >&2; exit 1 ;;
esac
"""

FAKE_HELM = r"""#!/usr/bin/env bash
printf '%s\n' "helm $*" >>"${FAKE_LOG}"
case "$1" in
  package) exec "${REAL_HELM}" "$@" ;;
  push) for a in "$@"; do [[ "${a}" != *.tgz ]] || cp "${a}" "${FAKE_OUT}/pushed.tgz"; done ;;
  *) echo "fake helm: unexpected $*" >&2; exit 1 ;;
esac
"""


@dataclass
class Run:
    done: subprocess.CompletedProcess
    calls: list[str]
    """Every podman and helm command line, in order."""
    out: Path

    @property
    def pushed_chart(self) -> Path:
        return self.out / "pushed.tgz"


@pytest.fixture
def release(tmp_path: Path):
    root = tmp_path / "repo"
    (root / "hack").mkdir(parents=True)
    shutil.copy2(REPO / "hack" / "release.sh", root / "hack" / "release.sh")
    shutil.copy2(REPO / "pyproject.toml", root / "pyproject.toml")
    shutil.copytree(CHART, root / "helm" / "rl-scheduler")
    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    bin_dir.mkdir()
    out.mkdir()
    for name, text in (("podman", FAKE_PODMAN), ("helm", FAKE_HELM)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    log = tmp_path / "calls.log"

    def run(*args: str, **env: str) -> Run:
        log.write_text("")
        done = subprocess.run(
            [str(root / "hack" / "release.sh"), *args],
            capture_output=True,
            text=True,
            timeout=120,
            env={
                **os.environ,
                "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                "FAKE_LOG": str(log),
                "FAKE_OUT": str(out),
                "FAKE_DIGEST": DIGEST,
                "REAL_HELM": str(HELM),
                "HELM_CACHE_HOME": str(tmp_path / "helm-cache"),
                "HELM_CONFIG_HOME": str(tmp_path / "helm-config"),
                "HELM_DATA_HOME": str(tmp_path / "helm-data"),
                **env,
            },
        )
        return Run(done, log.read_text().splitlines(), out)

    run.root = root  # type: ignore[attr-defined]
    return run


def rendered_images(chart: Path, tmp_path: Path) -> set[str]:
    """The images of a default `helm template` of ``chart`` (a packaged .tgz or a folder)."""
    done = subprocess.run(
        [str(HELM), "template", "rl-scheduler", str(chart), "--namespace", "rlsched-system"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    images = set()
    for obj in yaml.safe_load_all(done.stdout):
        if obj and obj["kind"] == "Deployment":
            spec = obj["spec"]["template"]["spec"]
            images |= {c["image"] for c in [*spec.get("initContainers", []), *spec["containers"]]}
    return images


def test_the_packaged_chart_names_the_pushed_image(release, tmp_path: Path) -> None:
    before = (release.root / "helm" / "rl-scheduler" / "values.yaml").read_bytes()
    r = release(
        REGISTRY, "--image", "localhost/x:1", FAKE_SEARCH_ERROR="invalid status code from registry 404 (Not Found)"
    )
    assert r.done.returncode == 0, r.done.stderr
    assert any(" push " in c and "--digestfile" in c for c in r.calls), r.calls
    assert r.pushed_chart.exists(), r.calls
    images = rendered_images(r.pushed_chart, tmp_path)
    pinned = f"{REGISTRY}/rl-scheduler@{DIGEST}"
    assert {i for i in images if "kube-scheduler" not in i} == {pinned}, images
    install = r.done.stdout.splitlines()[-1].strip()
    assert install == (
        f"helm install rl-scheduler oci://{REGISTRY}/charts/rl-scheduler --version {CHART_VERSION} "
        "-n rlsched-system --wait"
    )
    assert f"@{DIGEST}" in r.done.stdout
    # The source chart keeps its local default; the packaged values differ in those two lines only.
    assert (release.root / "helm" / "rl-scheduler" / "values.yaml").read_bytes() == before
    with tarfile.open(r.pushed_chart) as tar:
        packaged = tar.extractfile("rl-scheduler/values.yaml").read().decode()  # type: ignore[union-attr]
    changed = set(packaged.splitlines()) ^ set(before.decode().splitlines())
    assert changed == {
        f'  repository: "{REGISTRY}/rl-scheduler"',
        f'  digest: "{DIGEST}"',
        "  repository: localhost/rl-scheduler",
        '  digest: ""',
    }, changed


def test_a_chart_only_release_names_the_registrys_tag(release, tmp_path: Path) -> None:
    r = release(REGISTRY, "--no-image")
    assert r.done.returncode == 0, r.done.stderr
    assert not any(c.startswith("podman ") for c in r.calls), r.calls
    images = rendered_images(r.pushed_chart, tmp_path)
    assert {i for i in images if "kube-scheduler" not in i} == {f"{REGISTRY}/rl-scheduler:{APP_VERSION}"}, images


@pytest.mark.parametrize("tags", [APP_VERSION, f"0.0.1 {APP_VERSION} latest"])
def test_an_existing_tag_is_refused(release, tags: str) -> None:
    r = release(REGISTRY, "--image", "localhost/x:1", "--plain-http", FAKE_TAGS=tags)
    assert r.done.returncode == 2, r.done.stderr
    errors = [line for line in r.done.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and f"{REGISTRY}/rl-scheduler:{APP_VERSION}" in errors[0] and "--force" in errors[0]
    assert len(r.calls) == 1 and " search --list-tags " in r.calls[0] and "--tls-verify=false" in r.calls[0], r.calls
    assert r.done.stdout == ""


def test_force_pushes_over_an_existing_tag(release) -> None:
    r = release(REGISTRY, "--image", "localhost/x:1", "--force", FAKE_TAGS=APP_VERSION)
    assert r.done.returncode == 0, r.done.stderr
    assert not any(" search " in c for c in r.calls)
    pushes = [c for c in r.calls if c.startswith("podman ") and " push " in c]
    assert len(pushes) == 1 and pushes[0].endswith(f" {REGISTRY}/rl-scheduler:{APP_VERSION}"), r.calls


def test_other_tags_do_not_count(release) -> None:
    r = release(
        REGISTRY, "--image", "localhost/x:1", "--no-chart", FAKE_TAGS=f"{APP_VERSION}-rc1 {APP_VERSION}.1 latest"
    )
    assert r.done.returncode == 0, r.done.stderr
    assert any(" push " in c for c in r.calls)


def test_a_registry_that_cannot_be_asked_stops_the_release(release) -> None:
    r = release(REGISTRY, "--image", "localhost/x:1", FAKE_SEARCH_ERROR="dial tcp: connection refused")
    assert r.done.returncode == 1
    assert "connection refused" in r.done.stderr and "--force skips the check" in r.done.stderr
    assert len(r.calls) == 1, r.calls
