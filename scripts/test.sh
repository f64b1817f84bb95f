#!/usr/bin/env bash
# README command 2: install everything, lint and type-check the code, run the whole test suite.
# Needs PostgreSQL (127.0.0.1:5432, database `test`) and Redis (127.0.0.1:6379); the tests fail
# loudly when either is missing. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh dev
bash scripts/system-deps.sh
# Lint and type check are part of the suite: the tree is clean, and a change that breaks that
# fails here (recovery/ and agents/ are type-checked strictly, see pyproject.toml).
.venv/bin/ruff check .
.venv/bin/mypy app agents workload recovery integrations
exec .venv/bin/python -m pytest "$@"
