#!/usr/bin/env bash
# System packages the test suite drives for real: Chromium (dashboard e2e tests), promtool
# (Prometheus config/rules/exposition checks) and Alertmanager (its webhook integration test).
# Installed from Debian with apt when missing; needs root (CI runs as root).
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || command -v alertmanager >/dev/null 2>&1 \
    || need+=(prometheus-alertmanager)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "system-deps: missing ${need[*]}; install them (apt-get install ${need[*]}) or run as root" >&2
        exit 1
    fi
    echo "system-deps: installing ${need[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
