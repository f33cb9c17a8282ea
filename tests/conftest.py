"""Shared pytest fixtures.

The openb trace is never copied into the repository: tests that need it find it through
``RLSCHED_OPENB_DIR`` (default for the tests only: ``<repo>/../shared/data/openb``) and skip when it
is absent. When the variable is unset and that folder exists, it is set here, before anything imports
``rlsched``, so that the code's openb defaults (``rlsched.policy.trace.openb_file``) and the scripts the
tests start see the same folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
"""The repository root (the folder holding pyproject.toml)."""

OPENB_ENV = "RLSCHED_OPENB_DIR"
"""Environment variable naming the folder with the openb CSV files (``rlsched.policy.trace.OPENB_ENV``)."""

_TEST_OPENB = REPO_ROOT.parent / "shared" / "data" / "openb"
if not os.environ.get(OPENB_ENV) and _TEST_OPENB.is_dir():
    os.environ[OPENB_ENV] = str(_TEST_OPENB)


def openb_path() -> Path:
    """Where the openb trace should be: ``$RLSCHED_OPENB_DIR`` or ``<repo>/../shared/data/openb``."""
    configured = os.environ.get(OPENB_ENV)
    return Path(configured) if configured else _TEST_OPENB


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root."""
    return REPO_ROOT


@pytest.fixture(scope="session")
def openb_dir() -> Path:
    """The openb trace folder; skips the test when the trace is not there."""
    path = openb_path()
    needed = ("openb_node_list_gpu_node.csv", "openb_pod_list_default.csv")
    missing = [name for name in needed if not (path / name).is_file()]
    if missing:
        pytest.skip(
            f"openb trace not found: {path} lacks {', '.join(missing)}; set {OPENB_ENV} to the folder with "
            "the cluster-trace-gpu-v2023 CSV files (github.com/alibaba/clusterdata) to run this test"
        )
    return path
