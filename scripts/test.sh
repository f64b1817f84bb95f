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
.venv/bin/ruff format --check .  # the tree stays formatted: `ruff format .` before committing
.venv/bin/mypy app agents workload recovery integrations
# Detection quality over the labelled trace corpus (precision, recall >= 0.98, no false heavy
# tier, every delay within its window): its verdict printed, and a failure stops here.
.venv/bin/rlguard replay tests/policy_traces --check | grep -v "^ok "
# Given test paths (or node ids), run just those. The whole suite runs in two pytest
# processes, the Ray tests apart, because ray.init() keeps Ray's driver runtime (gRPC threads, its native library) in the
# test process until the session ends, and a whole-suite run with it alive beside the later
# tests died once with SIGSEGV inside an unrelated test.
for arg in "$@"; do
    if [ -e "${arg%%::*}" ]; then exec .venv/bin/python -m pytest "$@"; fi
done
# Both parts always run (a failure in the first must not hide the state of the second); the
# command fails if either did. The first runs in RLGUARD_TEST_WORKERS pytest-xdist workers (4 by
# default: most of a test's time is spent waiting on the servers, workers and jobs it starts),
# a test file to a worker, files with slow tests first (see tests/conftest.py).
status=0
# The 20 slowest tests are listed at its end: the suite is kept under 45 minutes.
.venv/bin/python -m pytest -n "${RLGUARD_TEST_WORKERS:-4}" --dist loadfile --no-loadscope-reorder \
    --durations=20 --ignore=tests/integration/ray "$@" || status=$?
.venv/bin/python -m pytest tests/integration/ray "$@" || status=$?
exit "$status"
