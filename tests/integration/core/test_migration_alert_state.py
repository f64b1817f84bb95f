"""Revision 0017_alert_state on both databases: an open incident whose alert was muted when the
revision runs keeps its alert held back (sent once nothing mutes it), nothing else is re-alerted,
and the revision goes down and up again."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from app.core import migrate
from app.core.db import make_engine

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
AT = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)

# Timelines as the muting at write time left them: (status, entry types, oldest first).
TIMELINES = {
    "still_muted": ("open", ["opened", "silenced", "escalated"]),
    "unmuted_since": ("open", ["opened", "inhibited", "unmuted"]),
    "muted_then_resolved": ("resolved", ["opened", "maintenance", "resolved"]),
    "never_muted": ("open", ["opened", "escalated"]),
}


def _seed(conn: sa.Connection) -> dict[str, int]:
    meta = sa.MetaData()
    incident = sa.Table("incident", meta, autoload_with=conn)
    event = sa.Table("incident_event", meta, autoload_with=conn)
    ids = {}
    for key, (status, types) in TIMELINES.items():
        ids[key] = conn.execute(
            incident.insert()
            .values(
                key=key,
                kind="gpu_xid",
                tier="medium",
                status=status,
                subject={},
                summary="",
                evidence={},
                reasons=[],
                escalated=False,
                recovery_failures=0,
                safe_mode=False,
                opened_at=AT,
                updated_at=AT,
            )  # fmt: skip
            .returning(incident.c.id)
        ).scalar_one()
        for type_ in types:
            conn.execute(
                event.insert().values(
                    incident_id=ids[key], at=AT, type=type_, actor="system", detail={}
                )
            )
    return ids


def test_a_still_muted_incident_keeps_its_alert_held_back(database_url: str) -> None:
    migrate.upgrade(database_url, "0016_drills")
    engine = make_engine(database_url)
    try:
        with engine.begin() as conn:
            ids = _seed(conn)
        migrate.upgrade(database_url)
        with engine.connect() as conn:
            held = conn.execute(
                sa.text(
                    "SELECT incident_id, type, alert_state FROM incident_event"
                    " WHERE alert_state IS NOT NULL"
                )
            ).all()
        assert [tuple(r) for r in held] == [(ids["still_muted"], "silenced", "muted")]
        migrate.downgrade(database_url, "0016_drills")
        with engine.connect() as conn:
            columns = {c["name"] for c in sa.inspect(conn).get_columns("incident_event")}
        assert "alert_state" not in columns
        migrate.upgrade(database_url)
        assert migrate.current_revision(database_url) == migrate.head_revision(database_url)
    finally:
        engine.dispose()
