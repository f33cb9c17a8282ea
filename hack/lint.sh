#!/usr/bin/env bash
# The checks every change passes before its tests (hack/test.sh runs this first; so does pre-commit):
#   ruff check            lint (rules in pyproject.toml [tool.ruff.lint])
#   ruff format --check   formatting (line length 120)
#   mypy                  types, strict (pyproject.toml [tool.mypy]; hack/typecheck.py lays the package out
#                         for it under .cache/mypy; about 30 s cold, 1 s with its cache)
#
# Usage: hack/lint.sh [--fix]      --fix: apply ruff's safe fixes and format first, then check
# Env:   VENV  the virtual environment with the dev extra (default: .venv)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONSAFEPATH=1
VENV="${VENV:-.venv}"
log() { printf '[lint %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [[ "${1:-}" == "--fix" ]]; then
  "${VENV}/bin/ruff" check --fix --quiet . || true
  "${VENV}/bin/ruff" format --quiet .
fi

status=0
log "ruff check"
"${VENV}/bin/ruff" check . || status=1
log "ruff format --check"
"${VENV}/bin/ruff" format --check . || status=1
log "mypy"
"${VENV}/bin/python" hack/typecheck.py || status=1

if [[ ${status} -eq 0 ]]; then log "all clean"; else log "FAILED (see above)"; fi
exit "${status}"
