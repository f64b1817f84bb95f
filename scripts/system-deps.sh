#!/usr/bin/env bash
# System packages the test suite drives for real: Chromium (dashboard e2e tests), promtool
# (Prometheus config/rules/exposition checks), Alertmanager (its webhook integration test) and
# Slurm with munge (the Slurm launcher backend's integration tests) and nginx (the reference
# proxy config in front of a real server: tests/integration/auth/test_reference_proxy.py).
# Installed from Debian with apt when missing; needs root (CI runs as root).
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || command -v alertmanager >/dev/null 2>&1 \
    || need+=(prometheus-alertmanager)
# amtool (same package) drives RLGuard's Alertmanager API v2 in tests/integration/silences.
command -v amtool >/dev/null 2>&1 || need+=(prometheus-alertmanager)
# Slurm (one slurmctld + one slurmd started by tests/integration/slurm, CPU only) and munge,
# its authentication daemon: the Slurm launcher backend is tested against the real scheduler.
command -v slurmctld >/dev/null 2>&1 || need+=(slurmctld)
command -v slurmd >/dev/null 2>&1 || need+=(slurmd)
command -v scontrol >/dev/null 2>&1 || need+=(slurm-client)
command -v munged >/dev/null 2>&1 || need+=(munge)
[ -x /usr/sbin/nginx ] || need+=(nginx-light)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "system-deps: missing ${need[*]}; install them (apt-get install ${need[*]}) or run as root" >&2
        exit 1
    fi
    echo "system-deps: installing ${need[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
