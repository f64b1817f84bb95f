#!/usr/bin/env bash
# README command 1: install and run RLGuard in embedded mode (SQLite, no external server).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/rlguard up "$@"
