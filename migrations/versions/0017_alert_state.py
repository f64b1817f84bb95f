"""incident_event.alert_state: the alert path decides muting when it builds a delivery

Revision ID: 0017_alert_state
Revises: 0016_drills
Create Date: 2026-12-07 02:40:00

Entries written before this revision are done (their alerts were queued or muted when they were
written), except that an open incident whose alert is still muted keeps one entry ``muted``, so
that the alert path sends it once nothing mutes it any more (the sweeper that used to do that is
gone).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017_alert_state"
down_revision: str | Sequence[str] | None = "0016_drills"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_MUTES = ("silenced", "maintenance", "inhibited")


def upgrade() -> None:
    with op.batch_alter_table("incident_event", schema=None) as batch_op:
        batch_op.add_column(sa.Column("alert_state", sa.String(length=8), nullable=True))
        batch_op.create_index(batch_op.f("ix_incident_event_alert_state"), ["alert_state"])
    event = sa.table(
        "incident_event",
        sa.column("id", sa.Integer),
        sa.column("incident_id", sa.Integer),
        sa.column("type", sa.String),
        sa.column("alert_state", sa.String),
    )
    incident = sa.table("incident", sa.column("id", sa.Integer), sa.column("status", sa.String))
    bind = op.get_bind()
    open_ids = sa.select(incident.c.id).where(incident.c.status == "open")
    newest = (
        sa.select(event.c.incident_id, event.c.type, sa.func.max(event.c.id).label("id"))
        .where(event.c.incident_id.in_(open_ids), event.c.type.in_([*_MUTES, "unmuted"]))
        .group_by(event.c.incident_id, event.c.type)
    )
    muted_at: dict[int, int] = {}
    unmuted_at: dict[int, int] = {}
    for incident_id, type_, event_id in bind.execute(newest):
        into = unmuted_at if type_ == "unmuted" else muted_at
        into[incident_id] = max(into.get(incident_id, 0), event_id)
    still_muted = [i for i, at in muted_at.items() if at > unmuted_at.get(i, 0)]
    if still_muted:
        # The mute entry itself stands for the alert held back: it is alerted as an `unmuted`.
        bind.execute(
            sa.update(event)
            .where(event.c.id.in_([muted_at[i] for i in still_muted]))
            .values(alert_state="muted")
        )


def downgrade() -> None:
    with op.batch_alter_table("incident_event", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_incident_event_alert_state"))
        batch_op.drop_column("alert_state")
