"""hack/build-image.sh against a fake ``podman``, and the Dockerfile's labels it prunes by.

A build leaves two images: the final one (tagged) and the Dockerfile's build stage (~670 MB), whose
layers are the cache of the next build. An image prune that matches only the final stage's label leaves
every superseded build stage behind as a dangling image; one that matches the build stage too, while
that stage is untagged, would prune this build's cache as well. So: the script builds the build stage
first under its own tag (the full build then reuses its layers), both stages carry the label the prune
filters on, and the prune comes last. (podman prunes until nothing more matches: a superseded build
stage's whole chain goes, down to the layers the current one shares with it.)
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

FAKE_PODMAN = r"""#!/usr/bin/env bash
printf '%s\n' "$*" >>"${FAKE_LOG}"
while [[ "$1" == --cgroup-manager=* ]]; do shift; done
case "$1 $2" in
  "image exists") exit 0 ;;
  "image inspect") echo 123 ;;
esac
"""


def stages(dockerfile: str) -> list[list[str]]:
    """The Dockerfile's instructions (continuations joined, comments dropped), one list per FROM."""
    text = re.sub(r"\\\n", " ", dockerfile)
    out: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            out.append([])
        if out:
            out[-1].append(line)
    return out


def labels(stage: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in stage:
        if line.upper().startswith("LABEL "):
            found.update((k, v.strip('"')) for k, v in re.findall(r'([\w.-]+)=("[^"]*"|\S+)', line[6:]))
    return found


def run_build_image(
    tmp_path: Path, *args: str, podman: str = FAKE_PODMAN, env_extra: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, list[str]]:
    root = tmp_path / "repo"
    (root / "hack").mkdir(parents=True)
    shutil.copy2(REPO / "hack" / "build-image.sh", root / "hack" / "build-image.sh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("podman", podman), ("runc", "#!/bin/sh\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    log = tmp_path / "podman.log"
    log.write_text("")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FAKE_LOG": str(log),
        "PIP_CERT": "",
        **(env_extra or {}),
    }
    env.pop("PIP_INDEX_URL", None)
    done = subprocess.run(
        [str(root / "hack" / "build-image.sh"), *args], capture_output=True, text=True, timeout=60, env=env
    )
    return done, log.read_text().splitlines()


def test_the_build_stage_is_tagged_before_the_image_and_both_carry_the_pruned_label(tmp_path: Path) -> None:
    done, calls = run_build_image(tmp_path, "--tag", "localhost/rl-scheduler:t1")
    assert done.returncode == 0, done.stderr
    builds = [c for c in calls if " build " in f" {c} "]
    prunes = [c for c in calls if " image prune " in f" {c} "]
    assert len(builds) == 2 and len(prunes) == 1, calls
    first, second = builds
    assert re.search(r" --target build -t localhost/rl-scheduler-build:cache \.$", first), first
    assert second.endswith(" -t localhost/rl-scheduler:t1 .") and "--target" not in second, second
    assert first.replace(" --target build -t localhost/rl-scheduler-build:cache", "") == second.replace(
        " -t localhost/rl-scheduler:t1", ""
    ), "the same build arguments: the second build reuses the first one's layers"
    assert calls.index(prunes[0]) > calls.index(second)
    key, value = re.search(r"--filter label=([\w.-]+)=(\S+)", prunes[0]).groups()  # type: ignore[union-attr]

    build, final = stages((REPO / "Dockerfile").read_text())
    assert re.match(r"FROM \S+ AS build$", build[0], re.IGNORECASE), build[0]
    assert labels(final).get(key) == value and labels(build).get(key) == value, (labels(build), labels(final))
    # Every layer of the build stage inherits the label: it comes before the stage's first RUN or COPY.
    first_label = next(i for i, line in enumerate(build) if line.upper().startswith("LABEL ") and key in line)
    first_layer = next(i for i, line in enumerate(build) if line.split()[0].upper() in {"RUN", "COPY"})
    assert first_label < first_layer, build


FLAKY_PODMAN = (
    FAKE_PODMAN
    + r"""
# FAKE_FAIL=ebusy: the first build fails as a step that could not start; other: every build fails.
if [[ "$1" == build ]]; then
  builds=$(grep -c ' build \|^build ' "${FAKE_LOG}")
  if [[ "${FAKE_FAIL}" == ebusy && ${builds} -eq 1 ]]; then
    echo 'Close_Fd sealing memfd copy: Device or resource busy' >&2; exit 125
  fi
  if [[ "${FAKE_FAIL}" == other ]]; then echo 'Error: no space left on device' >&2; exit 125; fi
fi
"""
)


def run_with(tmp_path: Path, fail: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    return run_build_image(
        tmp_path, "--tag", "localhost/rl-scheduler:t1", podman=FLAKY_PODMAN, env_extra={"FAKE_FAIL": fail}
    )


def test_a_build_step_that_fails_to_start_with_ebusy_is_retried_once(tmp_path: Path) -> None:
    done, calls = run_with(tmp_path, "ebusy")
    assert done.returncode == 0, done.stderr
    assert len([c for c in calls if c.split()[1:2] == ["build"]]) == 3, calls  # stage, its retry, the image
    assert "sealing memfd copy" in done.stderr and "retrying the build once" in done.stderr


def test_any_other_build_failure_stops_at_once(tmp_path: Path) -> None:
    done, calls = run_with(tmp_path, "other")
    assert done.returncode == 125
    assert len([c for c in calls if c.split()[1:2] == ["build"]]) == 1, calls
    assert "no space left on device" in done.stderr
