"""Load a script of benchmarks/ or hack/ as a module, for the tests of its pure parts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path) -> Any:
    """``path`` as module ``name``, loaded once per test session and kept in ``sys.modules`` (for
    dataclasses, and for pickling into a process pool: a second copy's classes would not be the ones
    ``sys.modules`` names, and would not pickle)."""
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path):
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)  # not half a module for the next caller
        raise
    return module


def load_benchmark(name: str) -> Any:
    """``benchmarks/<name>.py`` as module ``name``."""
    return _load(name, REPO_ROOT / "benchmarks" / f"{name}.py")


def load_hack_script(name: str) -> Any:
    """``hack/<name>.py`` as module ``name``."""
    return _load(name, REPO_ROOT / "hack" / f"{name}.py")
