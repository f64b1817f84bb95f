"""The embedded default: `rlguard up` with no Redis runs its own Celery worker (SQLite broker),
and faults sent to it are repaired; Prometheus Alertmanager alerts become incidents too."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest
from sqlmodel import Session

from app.auth.tokens import create_node_token
from app.auth.users import create_user
from app.core.db import make_engine
from app.models import Role
from tests.harness import REPO, RLGUARD, ServerProcess, free_port, wait_for
from tests.harness.stack import JOB, fast_policy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_up_runs_the_embedded_worker_and_takes_alertmanager_alerts(tmp_path: Path) -> None:
    port = free_port()
    data = tmp_path / "data"
    (tmp_path / "runs" / JOB).mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLGUARD_")}
    env.update(
        PYTHONPATH=str(REPO),
        RLGUARD_DATA_DIR=str(data),
        RLGUARD_RECOVERY_EMBEDDED_NODES="n0",
        RLGUARD_RECOVERY_RUN_ROOT=str(tmp_path / "runs"),
        RLGUARD_RECOVERY_POLICY_FILE=str(fast_policy(tmp_path / "policy.yaml")),
    )
    up = ServerProcess(
        [*RLGUARD, "up", "--host", "127.0.0.1", "--port", str(port)],
        env,
        port,
        tmp_path / "up.log",
        ready_path="/healthz",
    )
    http = httpx.Client(base_url=up.url, timeout=10)
    try:
        up.start()
        engine = make_engine(f"sqlite:///{data / 'rlguard.db'}")
        with Session(engine) as s:
            node_token = create_node_token(s, node="n0", actor="test")[1]
            operator = create_user(s, name="olga", role=Role.operator, actor="test")[1]
            viewer = create_user(s, name="vera", role=Role.viewer, actor="test")[1]
            s.commit()
        engine.dispose()
        labels = {"job": JOB, "role": "trainer", "rank": "0"}

        def send(seq: int, failures: int) -> None:
            now = time.time()
            body = {
                "agent_id": "a",
                "node": "n0",
                "seq": seq,
                "sent_at": now,
                "fingerprint": None,
                "samples": [
                    {
                        "name": "train_step_failures_total",
                        "value": failures,
                        "ts": now,
                        "labels": labels,
                    },
                    {"name": "train_last_failed_step", "value": 31, "ts": now, "labels": labels},
                ],
                "participants": [
                    {
                        "job": JOB,
                        "role": "trainer",
                        "rank": 0,
                        "phase": "TRAIN",
                        "step": 31,
                        "ts": now,
                    }
                ],
            }
            r = http.post(
                "/api/v1/ingest", json=body, headers={"Authorization": f"Bearer {node_token}"}
            )
            assert r.status_code == 200, r.text

        for seq in range(1, 4):
            send(seq, 0)
            time.sleep(0.5)  # the scenario: a counter steady over a few policy ticks (0.5 s)
        send(4, 1)
        request = tmp_path / "runs" / JOB / "recovery" / "requests" / "skip_step-31.json"
        wait_for(request.exists, 45, f"{request.name}", context=up.output)

        alert = {
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
        auth = {"Authorization": f"Bearer {operator}"}
        assert (
            http.post(
                "/api/v1/alertmanager", json=alert, headers={"Authorization": f"Bearer {viewer}"}
            ).status_code
            == 403
        )
        bad = dict(alert, version="3")
        r = http.post("/api/v1/alertmanager", json=bad, headers=auth)
        assert r.status_code == 422 and "version" in r.text
        bad_label = dict(
            alert, alerts=[dict(alert["alerts"][0], labels={"rlguard_kind": "volcano"})]
        )
        r = http.post("/api/v1/alertmanager", json=bad_label, headers=auth)
        assert r.status_code == 422 and "volcano" in r.json()["detail"]
        r = http.post("/api/v1/alertmanager", json=alert, headers=auth)
        assert r.status_code == 200 and r.json() == {"firing": 1, "resolved": 0}

        def incident(kind: str, node: str):
            rows = http.get("/api/v1/incidents", headers=auth).json()["incidents"]
            return next((i for i in rows if i["kind"] == kind and i["node"] == node), None)

        silent = wait_for(
            lambda: incident("node_silent", "n7"), 20, "an incident from the Alertmanager alert"
        )
        assert "node-exporter down" in silent["summary"]
        r = http.get("/api/v1/incidents?status=bogus", headers=auth)
        assert r.status_code == 422 and "status must be one of" in r.text
    finally:
        http.close()
        up.stop(timeout=20)
