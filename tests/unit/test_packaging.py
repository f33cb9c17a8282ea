"""Packaging: every Python package folder is listed in pyproject.toml, and the installed entry points work."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOTS = ("policy", "extender", "operator", "rlsched")


def setuptools_config(repo_root: Path) -> dict:
    return tomllib.loads((repo_root / "pyproject.toml").read_text())["tool"]["setuptools"]


def package_folders(repo_root: Path, package_dir: dict[str, str]) -> dict[str, Path]:
    """Dotted package name → folder, for every folder with an ``__init__.py`` under the mapped roots."""
    folder_to_package = {folder: package for package, folder in package_dir.items()}
    found = {}
    for root in ROOTS:
        base = repo_root / root
        for init in sorted(base.rglob("__init__.py")):
            folder = init.parent
            if "__pycache__" in folder.parts:
                continue
            relative = folder.relative_to(base).parts
            found[".".join((folder_to_package[root], *relative))] = folder
    return found


def test_roots_are_mapped(repo_root: Path) -> None:
    package_dir = setuptools_config(repo_root)["package-dir"]
    assert {folder for folder in package_dir.values()} >= set(ROOTS)
    assert package_dir["rlsched.policy"] == "policy"


def test_every_package_folder_is_listed(repo_root: Path) -> None:
    config = setuptools_config(repo_root)
    listed = set(config["packages"])
    found = package_folders(repo_root, config["package-dir"])
    assert {"rlsched", "rlsched.policy", "rlsched.policy.scorers", "rlsched.extender", "rlsched.operator"} <= set(found)
    missing = sorted(set(found) - listed)
    assert not missing, (
        f"folders with an __init__.py that pyproject.toml's [tool.setuptools] packages does not list: "
        f"{', '.join(f'{name} ({found[name].relative_to(repo_root)})' for name in missing)}"
    )
    # ...and nothing listed that does not exist (data-only packages have a folder but no __init__.py).
    stale = sorted(name for name in listed - set(found) if not package_folder(repo_root, config, name).is_dir())
    assert not stale, f"pyproject.toml lists packages without a folder: {', '.join(stale)}"


def package_folder(repo_root: Path, config: dict, package: str) -> Path:
    """The folder of a dotted package name under the package-dir mapping (the longest mapped prefix)."""
    mapped = max((name for name in config["package-dir"] if package == name or package.startswith(name + ".")), key=len)
    return repo_root / config["package-dir"][mapped] / Path(*package[len(mapped) :].split(".")[1:])


def test_data_folders_are_listed_as_packages(repo_root: Path) -> None:
    """A folder that ships only data files (models, CRDs) is a package to setuptools: unlisted, the build
    warns "Package ... is absent from the `packages` configuration" and may drop it in a later release."""
    config = setuptools_config(repo_root)
    listed = set(config["packages"])
    data_owners = {name for name in config.get("package-data", {})}
    assert {"rlsched.policy.models", "rlsched.operator.crds"} <= listed & data_owners
    for name in listed:
        folder = package_folder(repo_root, config, name)
        assert folder.is_dir(), f"{name}: {folder} missing"


def test_license_is_an_spdx_string(repo_root: Path) -> None:
    """PEP 639: ``license`` is an SPDX expression and the text ships through ``license-files``; the
    older TOML table form makes setuptools (>= 77) print a deprecation warning on every install."""
    project = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] and all((repo_root / name).is_file() for name in project["license-files"])


def test_wheel_builds_without_warnings_and_ships_its_data(repo_root: Path, tmp_path: Path) -> None:
    """Build the wheel the way the image does, with this environment's setuptools (no download), and read
    what setuptools said: no deprecation, no "Package ... is absent", and every data file inside."""
    pytest.importorskip("setuptools")
    pytest.importorskip("wheel")
    # setuptools writes its egg-info into the source tree; build from a copy so a test never touches it.
    source = tmp_path / "src"
    shutil.copytree(
        repo_root,
        source,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv",
            ".tools",
            "*.egg-info",
            "__pycache__",
            "build",
            "dist",
            "runs",
            ".cache",
            "benchmarks",
            "tests",
        ),
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-v",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONSAFEPATH="1", PIP_NO_INPUT="1"),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = done.stdout + done.stderr
    for bad in (
        "SetuptoolsDeprecationWarning",
        "is absent from the `packages` configuration",
        "as a TOML table is deprecated",
    ):
        assert bad not in said, f"the build says {bad!r}:\n{said[said.find(bad) - 500 : said.find(bad) + 500]}"
    import zipfile

    (wheel,) = (tmp_path / "dist").glob("kube_rl_scheduler-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    config = setuptools_config(repo_root)
    expected = {"rlsched/extender/typical_default.json"}
    expected |= {
        f"rlsched/policy/models/{p.name}"
        for p in (repo_root / "policy" / "models").iterdir()
        if p.suffix in (".npz", ".json")
    }
    expected |= {f"rlsched/operator/crds/{p.name}" for p in (repo_root / "operator" / "crds").glob("*.yaml")}
    assert len(expected) >= 5 and "rlsched.operator.crds" in config["packages"]
    assert not expected - names, f"missing from the wheel: {sorted(expected - names)}"
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names), "LICENSE not in the wheel"


def test_packages_import_in_a_fresh_interpreter(repo_root: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import rlsched.policy, rlsched.extender, rlsched.operator; print('ok')"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=repo_root.parent,  # not the repo: import the installed mapping
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_rlsched_help_exits_0() -> None:
    script = Path(sys.executable).with_name("rlsched")
    command = [str(script)] if script.exists() else ([shutil.which("rlsched")] if shutil.which("rlsched") else None)
    if command is None:
        pytest.skip("the rlsched console script is not installed in this environment (pip install -e .)")
    done = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage: rlsched" in done.stdout and "evaluate" in done.stdout
    module = subprocess.run(
        [sys.executable, "-m", "rlsched", "evaluate", "--help"], capture_output=True, text=True, timeout=120
    )
    assert module.returncode == 0 and "--policy" in module.stdout, module.stderr


def test_operator_folder_shadows_stdlib_without_safe_path(repo_root: Path) -> None:
    """Why the hack/ scripts export PYTHONSAFEPATH: run from the repository root without any .pth file
    that happens to import `operator` early (`-S`, like a bare CI interpreter), `python -m` finds the
    `operator/` folder first and the interpreter cannot even start. With PYTHONSAFEPATH=1 it starts."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    bare = subprocess.run(
        [sys.executable, "-S", "-m", "json.tool", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=repo_root,
        env=env,
    )
    assert bare.returncode != 0 and "operator" in bare.stderr, bare.stderr
    safe = subprocess.run(
        [sys.executable, "-S", "-m", "json.tool", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=repo_root,
        env=dict(env, PYTHONSAFEPATH="1"),
    )
    assert safe.returncode == 0, safe.stderr


@pytest.mark.parametrize("script", ["test.sh", "demo.sh", "kind-e2e.sh"])
def test_scripts_that_run_python_set_safe_path_first(repo_root: Path, script: str) -> None:
    lines = (repo_root / "hack" / script).read_text().splitlines()
    guard = next((i for i, line in enumerate(lines) if line.strip() == "export PYTHONSAFEPATH=1"), None)
    assert guard is not None, f"hack/{script} does not export PYTHONSAFEPATH=1"
    first_python = next(
        i
        for i, line in enumerate(lines)
        if not line.lstrip().startswith("#") and ("python" in line.lower()) and "PYTHON" not in line.split("=")[0]
    )
    assert guard < first_python, (
        f"hack/{script}:{first_python + 1} runs Python before PYTHONSAFEPATH is exported (line {guard + 1})"
    )
