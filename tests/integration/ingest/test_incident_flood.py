"""One node reporting many faults at once, through the real app with its policy scheduler on
SQLite and PostgreSQL: no more than ``node_quotas.incidents_per_minute`` incidents about the node
open in any minute, one ``incident_flood`` incident says how many are held, and another node's
faults open as usual."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlmodel import Session, select

from app.core.config import NodeQuotaSettings
from app.main import create_app
from app.models.incident import Incident
from tests.harness import Api, AppClient, auth, make_settings, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PER_MINUTE = 3


@pytest.fixture
def scheduled_api(migrated_url: str, tmp_path: Path) -> Iterator[Api]:
    """The app with its server lifespans (the policy scheduler ticking every second)."""
    settings = make_settings(
        migrated_url,
        tmp_path / "data",
        node_quotas=NodeQuotaSettings(incidents_per_minute=PER_MINUTE),
    )
    client = AppClient(create_app(settings))
    try:
        yield Api(client)
    finally:
        client.close()


def exits(node: str, job: str, ranks: range) -> dict:
    now = time.time()
    return {
        "agent_id": "agent-1",
        "node": node,
        "seq": 0,
        "sent_at": now,
        "samples": [],
        "participants": [
            {"job": job, "role": "rollout", "rank": r, "phase": "EXITED", "step": 5, "ts": now}
            for r in ranks
        ],
    }


def incidents(api: Api) -> list[Incident]:
    with Session(api.engine) as s:
        return list(s.exec(select(Incident)).all())


def of_node(rows: list[Incident], node: str, kind: str | None = None) -> list[Incident]:
    return [i for i in rows if i.subject.get("node") == node and (kind is None or i.kind == kind)]


def test_one_node_exiting_everywhere_opens_its_budget_and_one_flood_incident(
    scheduled_api: Api,
) -> None:
    api = scheduled_api
    a, b = api.node_token("node-a"), api.node_token("node-b")
    r = api.client.post("/api/v1/ingest", json=exits("node-a", "flood", range(40)), headers=auth(a))
    assert r.status_code == 200, r.text
    r = api.client.post("/api/v1/ingest", json=exits("node-b", "calm", range(2)), headers=auth(b))
    assert r.status_code == 200, r.text
    wait_for(
        lambda: (
            of_node(incidents(api), "node-a", "incident_flood")
            and len(of_node(incidents(api), "node-b")) == 2
        ),
        timeout=60,
        what="the flood incident of node-a and node-b's two incidents",
    )
    sched = api.app.state.policy_scheduler  # type: ignore[attr-defined]
    seen = sched.last_tick.at
    wait_for(lambda: sched.last_tick.at >= seen + 3, timeout=60, what="three more ticks")
    rows = incidents(api)
    flood = of_node(rows, "node-a", "incident_flood")
    assert len(flood) == 1, "one flood incident per node, not one per tick"
    assert flood[0].tier == "medium"
    assert "node_quotas.incidents_per_minute" in flood[0].evidence["evidence"]["detail"]
    faults = sorted(
        (i.opened_at for i in of_node(rows, "node-a") if i.kind != "incident_flood"),
    )
    assert faults  # the budget was used (a quarter of it per 15 s)
    assert len(faults) < 40  # ... and the rest held
    # Never more than the budget in any minute, however long the ticks took.
    for i, first in enumerate(faults):
        in_minute = [t for t in faults[i:] if t - first < timedelta(seconds=60)]
        assert len(in_minute) <= PER_MINUTE, faults
