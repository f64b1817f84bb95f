#!/usr/bin/env bash
# README command 1: install RLGuard and run the whole product on this machine in embedded mode
# (SQLite, no Redis): server + worker + agent (simulated GPUs when there is none) + a small GRPO
# job + injected faults. Ctrl-C stops everything. Extra arguments go to `rlguard demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/rlguard demo "$@"
