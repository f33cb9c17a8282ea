#!/usr/bin/env bash
# Install everything this project needs on a fresh machine and run the whole test suite:
# unit tests, and end-to-end tests against a real kube-apiserver + kube-scheduler built from
# Go modules (hack/build-tools.sh, cached after the first build). This is what CI runs (.ci/run).
#
# Usage: hack/test.sh [PYTEST ARGS...]        e.g. hack/test.sh -m "not e2e"
# Env:   PYTHON   interpreter for the virtual environment (default: python3)
#
# The e2e tests (tests/e2e, docs/e2e.md) start their own cluster in a temporary folder on free
# ports; here they must run: RLSCHED_E2E_REQUIRE=1 turns "control-plane binaries missing" from a
# skip into a failure, so a broken tool build cannot pass as green.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The repository root holds a folder named `operator/` (mapped to rlsched.operator). `python -m X` and
# `python -c` put the current directory first on sys.path, where that folder would shadow the standard
# library's `operator` module before site-packages load; PYTHONSAFEPATH (Python 3.11+) stops that, here
# and in every process these scripts start.
export PYTHONSAFEPATH=1

log() { printf '[test %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

log "system packages"
hack/install-system-deps.sh --containers

log "python environment (.venv)"
if [[ ! -x .venv/bin/python ]]; then
  "${PYTHON:-python3}" -m venv .venv
elif ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
  # A venv made while ensurepip was missing (Debian without python3-venv) has bin/python but no pip.
  log ".venv has no pip (made without python3-venv?): making it again"
  "${PYTHON:-python3}" -m venv --clear .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[train,dev]'

log "control-plane tools (cached)"
hack/build-tools.sh

log "lint and format (hack/lint.sh)"
VENV=.venv hack/lint.sh

log "pytest"
export RLSCHED_E2E_REQUIRE="${RLSCHED_E2E_REQUIRE:-1}"
exec .venv/bin/python -m pytest tests -p no:cacheprovider -rs --durations=15 "$@"
