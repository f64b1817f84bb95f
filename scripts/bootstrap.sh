#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install RLGuard into it.
#   scripts/bootstrap.sh          runtime only
#   scripts/bootstrap.sh dev      runtime + test tools + the ucx extra (ucxx-cu12: UCX over TCP, no GPU needed)
#                                 + the trl extra (the TRL integration's tests run the real GRPOTrainer)
# torch is pinned to 2.13.0 (CPU build) because that wheel is available offline here; the
# project itself accepts torch>=2.4.
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-}"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
# setuptools tells every editable install of a multi-package tree like ours to "be careful with
# folders in your working directory with the same name as your package" (an InformationOnly
# warning, nothing to act on); only that message is silenced, so a newcomer's first screen is
# clean and any other warning still shows.
export PYTHONWARNINGS="ignore:Editable installation"
if [ "$extra" = "dev" ]; then
    # the ucx and trl extras too, so that the ucx transport and TRL integration tests run
    # rather than skip; the constraint keeps the torch installed above
    .venv/bin/python -m pip install -q -c <(echo "torch==2.13.0") -e ".[dev,ucx,trl,ray]"
else
    .venv/bin/python -m pip install -q -e .
fi
unset PYTHONWARNINGS
