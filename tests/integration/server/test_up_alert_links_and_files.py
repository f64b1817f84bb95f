"""`rlguard up --port P`: the alert the embedded worker sends links to port P (issue 17 item 8),
and everything in the data directory is the owner's only (item 6).

A real `up` on a free port, a real HTTP receiver for a webhook channel, an incident opened
through the Alertmanager endpoint with the first admin's token that `up` wrote.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import httpx
import pytest
import yaml

from tests.harness import free_port, wait_for
from tests.unit.app.alerts._recording_server import RecordingServer

from ._procs import clean_env, healthy, rlguard

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

ALERT = {
    "version": "4",
    "status": "firing",
    "receiver": "rlguard",
    "groupKey": '{}:{alertname="NodeDown"}',
    "alerts": [
        {
            "status": "firing",
            "labels": {"alertname": "NodeDown", "node": "n7"},
            "annotations": {"summary": "node-exporter down"},
            "startsAt": "2026-11-29T10:00:00Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "fingerprint": "f00d",
        }
    ],
}


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_alert_links_name_the_port_up_serves_and_the_data_dir_is_private(tmp_path: Path) -> None:
    receiver = RecordingServer()
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o755)  # as an older version (or a hand-made directory) left it
    alerts_yaml = data / "alerts.yaml"
    alerts_yaml.write_text(
        yaml.safe_dump(
            {
                "alerts": {
                    "group_wait_s": 0,
                    "channels": [
                        {
                            "type": "webhook",
                            "name": "hook",
                            "url": receiver.url("/hook"),
                            "min_tier": "light",
                            "signing_secret": "s3cret-for-the-test",
                        }
                    ],
                }
            }
        )
    )
    alerts_yaml.chmod(0o644)
    port = free_port()
    assert port != 8000
    env = clean_env(RLGUARD_DATA_DIR=str(data), RLGUARD_RECOVERY_EMBEDDED_NODES="n1")
    log = tmp_path / "up.log"
    url = f"http://127.0.0.1:{port}"
    try:
        with rlguard(["up", "--host", "127.0.0.1", "--port", str(port)], env, log) as up:
            healthy(url, up, log)
            creds = (data / "initial-admin-credentials.txt").read_text()
            token = next(
                line.split(": ", 1)[1]
                for line in creds.splitlines()
                if line.startswith("api_token: ")
            )
            r = httpx.post(
                url + "/api/v1/alertmanager",
                json=ALERT,
                timeout=10,
                headers={"Authorization": f"Bearer {token}"},
            )
            assert r.status_code == 200, r.text
            wait_for(lambda: receiver.requests, 45, "the alert at the receiver")
            body = json.loads(receiver.requests[0].body)
            incident = body["links"]["incident"]
            assert incident.startswith(f"http://127.0.0.1:{port}/incidents/"), incident

            assert _mode(data) == 0o700
            files = {p.name: _mode(p) for p in data.iterdir() if p.is_file()}
            assert {"rlguard.db", "celery-broker.sqlite", "secret_key", "alerts.yaml"} <= set(files)
            assert {name: mode for name, mode in files.items() if mode != 0o600} == {}
    finally:
        receiver.stop()
