#!/usr/bin/env python3
"""mypy on the package as it is installed (hack/lint.sh runs this; so do hack/test.sh, CI and pre-commit).

pyproject.toml's ``package-dir`` maps ``rlsched.policy`` to ``policy/`` (and so on), which mypy cannot
read: it names a module after its path. So the package is laid out as relative links under
``.cache/mypy/src`` (git-ignored, rebuilt on every run from ``package-dir``, nothing outside the
repository), mypy checks it by module name (``-p rlsched``) with its cache in ``.cache/mypy/cache``,
and the paths it prints are turned back into the repository's (``policy/trace.py:12: error: ...``).

Usage: hack/typecheck.py [MYPY ARGS...]      the settings are pyproject.toml's [tool.mypy]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = Path(".cache/mypy/src")
CACHE = Path(".cache/mypy/cache")


def package_dirs() -> dict[str, str]:
    """``package-dir`` from pyproject.toml: package name → folder, relative to the repository."""
    with open("pyproject.toml", "rb") as f:
        dirs: dict[str, str] = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return dirs


def lay_out(dirs: dict[str, str]) -> dict[str, str]:
    """Links under TREE for every mapped package; returns link prefix → folder prefix, for the output."""
    shutil.rmtree(TREE, ignore_errors=True)
    prefixes = {}
    for package, folder in sorted(dirs.items()):
        link = TREE / package.replace(".", "/")
        link.parent.mkdir(parents=True, exist_ok=True)
        if any(other.startswith(package + ".") for other in dirs):
            # Sub-packages live elsewhere: link this folder's modules one by one, the sub-packages beside them.
            link.mkdir()
            for module in sorted(Path(folder).glob("*.py")):
                (link / module.name).symlink_to(os.path.relpath(module, link))
        else:
            link.symlink_to(os.path.relpath(folder, link.parent), target_is_directory=True)
        prefixes[f"{link}/"] = f"{Path(folder)}/"
    return prefixes


def main(argv: list[str]) -> int:
    os.chdir(ROOT)
    prefixes = lay_out(package_dirs())
    top = sorted({package.split(".")[0] for package in package_dirs()})
    cmd = [sys.executable, "-m", "mypy", "--cache-dir", str(CACHE), *(a for p in top for a in ("-p", p)), *argv]
    # PYTHONSAFEPATH: `python -m` would put the repository first on sys.path, where operator/ shadows the
    # standard library's operator module (hack/test.sh)
    env = dict(os.environ, MYPYPATH=str(TREE), PYTHONSAFEPATH="1")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    longest_first = sorted(prefixes, key=len, reverse=True)
    for line in (done.stdout + done.stderr).splitlines():
        for prefix in longest_first:
            if line.startswith(prefix):
                line = prefixes[prefix] + line[len(prefix) :]
                break
        print(line)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
