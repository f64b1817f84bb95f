"""The real Alertmanager (Debian prometheus-alertmanager) feeds a real RLGuard server.

Alertmanager runs on loopback with its own data dir and no cluster gossip; its webhook receiver
posts to ``/api/v1/alertmanager`` with an operator's bearer token. An alert fired through
Alertmanager's own API must arrive as a stored FaultSignal of an open incident.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
import yaml
from sqlmodel import Session

from app.auth.users import create_user
from app.core import migrate
from app.core.db import make_engine
from app.models import Role
from app.models.incident import FaultSignalRecord
from tests.harness import RLGUARD, ServerProcess, free_port, rlguard_env, spawn, wait_for

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


class Alertmanager:
    def __init__(self, config: Path, data: Path, log: Path) -> None:
        assert ALERTMANAGER, "Alertmanager is not installed (Debian: prometheus-alertmanager)"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        with log.open("ab") as out:
            self.proc = spawn(
                [
                    ALERTMANAGER,
                    f"--config.file={config}",
                    f"--storage.path={data}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--cluster.listen-address=",  # no gossip: a single instance
                    "--log.level=debug",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self, timeout: float = 30) -> None:
        def ready() -> bool:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                return httpx.get(self.url + "/-/ready", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(ready, timeout, "Alertmanager /-/ready", context=self.log.read_text)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture
def stack(
    postgres_url: str, redis_url: str, tmp_path: Path
) -> Iterator[tuple[ServerProcess, str, str]]:
    migrate.upgrade(postgres_url)
    engine = make_engine(postgres_url)
    with Session(engine) as s:
        operator = create_user(s, name="am-webhook", role=Role.operator, actor="test")[1]
        s.commit()
    engine.dispose()
    port = free_port()
    env = rlguard_env(
        postgres_url,
        tmp_path / "data",
        RLGUARD_DEV="1",
        RLGUARD_REDIS_URL=redis_url,
        RLGUARD_RECOVERY_LEASE_SECONDS="3",
    )
    server = ServerProcess(
        [*RLGUARD, "server", "--host", "127.0.0.1", "--port", str(port)],
        env,
        port,
        tmp_path / "server.log",
    )
    try:
        server.start(timeout=90)
        yield server, operator, postgres_url
    finally:
        server.kill9()


def _config(server_url: str, token: str) -> dict:
    return {
        "route": {
            "receiver": "rlguard",
            "group_by": ["alertname", "node"],
            "group_wait": "1s",
            "group_interval": "5s",
            "repeat_interval": "1h",
        },
        "receivers": [
            {
                "name": "rlguard",
                "webhook_configs": [
                    {
                        "url": f"{server_url}/api/v1/alertmanager",
                        "send_resolved": True,
                        "http_config": {"authorization": {"type": "Bearer", "credentials": token}},
                    }
                ],
            }
        ],
    }


def test_alert_fired_in_alertmanager_becomes_a_fault_signal_and_incident(
    stack: tuple[ServerProcess, str, str], tmp_path: Path
) -> None:
    server, operator, db_url = stack
    cfg = tmp_path / "alertmanager.yml"
    cfg.write_text(yaml.safe_dump(_config(server.url, operator)))
    am = Alertmanager(cfg, tmp_path / "am-data", tmp_path / "alertmanager.log")
    try:
        am.wait_ready()
        now = datetime.now(UTC)
        alert = {
            "labels": {"alertname": "GPUXidError", "node": "gpu-node-7", "severity": "critical"},
            "annotations": {"summary": "XID 79 on GPU 3 (fell off the bus)"},
            "startsAt": now.isoformat(),
            "endsAt": (now + timedelta(minutes=10)).isoformat(),
        }
        r = httpx.post(f"{am.url}/api/v2/alerts", json=[alert], timeout=5)
        assert r.status_code == 200, r.text
        # Alertmanager itself holds it as active.
        active = httpx.get(f"{am.url}/api/v2/alerts", timeout=5).json()
        assert [a["labels"]["alertname"] for a in active] == ["GPUXidError"]

        auth = {"Authorization": f"Bearer {operator}"}

        def xid_incident() -> dict | None:
            rows = httpx.get(f"{server.url}/api/v1/incidents", headers=auth, timeout=5).json()
            return next(
                (
                    i
                    for i in rows["incidents"]
                    if i["kind"] == "gpu_xid" and i["node"] == "gpu-node-7"
                ),
                None,
            )

        found = wait_for(
            xid_incident,
            60,
            "an incident from the Alertmanager alert",
            interval=0.5,
            context=lambda: am.log.read_text()[-3000:] + server.output()[-3000:],
        )
        assert found["status"] in ("open", "recovering", "pending_approval", "escalated"), found
        assert "XID 79" in found["summary"]
        engine = make_engine(db_url)
        try:
            with Session(engine) as s:
                signals = (
                    s.execute(
                        sa.select(FaultSignalRecord).where(
                            FaultSignalRecord.incident_id == found["id"]
                        )
                    )
                    .scalars()
                    .all()
                )
                audit = s.execute(
                    sa.text(
                        "SELECT count(*) FROM audit_event WHERE action = 'alertmanager.webhook'"
                    )
                ).scalar_one()
        finally:
            engine.dispose()
        assert signals and signals[0].kind == "gpu_xid"
        assert signals[0].subject.get("node") == "gpu-node-7"
        assert audit >= 1
        # The webhook delivery as Alertmanager logged it: no failed notification.
        assert "Notify for alerts failed" not in am.log.read_text()
    finally:
        am.kill()


def test_alertmanager_with_a_wrong_token_is_refused(
    stack: tuple[ServerProcess, str, str], tmp_path: Path
) -> None:
    server, operator, _db = stack
    cfg = tmp_path / "alertmanager.yml"
    cfg.write_text(yaml.safe_dump(_config(server.url, "not-a-token")))
    am = Alertmanager(cfg, tmp_path / "am-data", tmp_path / "alertmanager.log")
    try:
        am.wait_ready()
        now = datetime.now(UTC)
        r = httpx.post(
            f"{am.url}/api/v2/alerts",
            json=[{"labels": {"alertname": "NodeDown", "node": "n9"}, "startsAt": now.isoformat()}],
            timeout=5,
        )
        assert r.status_code == 200
        wait_for(
            lambda: "401" in am.log.read_text(),
            30,
            "Alertmanager to log the 401",
            interval=0.5,
            context=lambda: am.log.read_text()[-3000:],
        )
        rows = httpx.get(
            f"{server.url}/api/v1/incidents",
            headers={"Authorization": f"Bearer {operator}"},
            timeout=5,
        ).json()["incidents"]
        assert not [i for i in rows if i["node"] == "n9"]  # refused means nothing changed
    finally:
        am.kill()
