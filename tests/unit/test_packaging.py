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
    # ...and nothing listed that does not exist.
    stale = sorted(listed - set(found))
    assert not stale, f"pyproject.toml lists packages without a folder: {', '.join(stale)}"


def test_packages_import_in_a_fresh_interpreter(repo_root: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import rlsched.policy, rlsched.extender, rlsched.operator; print('ok')"],
        capture_output=True, text=True, timeout=120, cwd=repo_root.parent,   # not the repo: import the installed mapping
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
    module = subprocess.run([sys.executable, "-m", "rlsched", "evaluate", "--help"], capture_output=True, text=True, timeout=120)
    assert module.returncode == 0 and "--policy" in module.stdout, module.stderr


def test_operator_folder_shadows_stdlib_without_safe_path(repo_root: Path) -> None:
    """Why the hack/ scripts export PYTHONSAFEPATH: run from the repository root without any .pth file
    that happens to import `operator` early (`-S`, like a bare CI interpreter), `python -m` finds the
    `operator/` folder first and the interpreter cannot even start. With PYTHONSAFEPATH=1 it starts."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    bare = subprocess.run([sys.executable, "-S", "-m", "json.tool", "--help"], capture_output=True, text=True,
                          timeout=60, cwd=repo_root, env=env)
    assert bare.returncode != 0 and "operator" in bare.stderr, bare.stderr
    safe = subprocess.run([sys.executable, "-S", "-m", "json.tool", "--help"], capture_output=True, text=True,
                          timeout=60, cwd=repo_root, env=dict(env, PYTHONSAFEPATH="1"))
    assert safe.returncode == 0, safe.stderr


@pytest.mark.parametrize("script", ["test.sh", "demo.sh", "kind-e2e.sh"])
def test_scripts_that_run_python_set_safe_path_first(repo_root: Path, script: str) -> None:
    lines = (repo_root / "hack" / script).read_text().splitlines()
    guard = next((i for i, line in enumerate(lines) if line.strip() == "export PYTHONSAFEPATH=1"), None)
    assert guard is not None, f"hack/{script} does not export PYTHONSAFEPATH=1"
    first_python = next(i for i, line in enumerate(lines)
                        if not line.lstrip().startswith("#") and ("python" in line.lower()) and "PYTHON" not in line.split("=")[0])
    assert guard < first_python, f"hack/{script}:{first_python + 1} runs Python before PYTHONSAFEPATH is exported (line {guard + 1})"
