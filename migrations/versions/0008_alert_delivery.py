"""alert deliveries (issue 8)

Revision ID: 0008_alert_delivery
Revises: 0002_policy_incidents
Create Date: 2026-11-29 15:45:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_alert_delivery"
down_revision: str | Sequence[str] | None = "0002_policy_incidents"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "alert_delivery",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("dedupe_key", sa.String(length=300), nullable=False),
        sa.Column("incident_id", sa.Integer(), nullable=False),
        sa.Column("event_id", sa.String(length=100), nullable=False),
        sa.Column("event_kind", sa.String(length=32), nullable=False),
        sa.Column("tier", sa.String(length=16), nullable=False),
        sa.Column("channel", sa.String(length=64), nullable=False),
        sa.Column("channel_type", sa.String(length=16), nullable=False),
        sa.Column("event", sa.JSON(), nullable=False),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("batch_id", sa.Integer(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("task_runs", sa.Integer(), nullable=False),
        sa.Column("parts_total", sa.Integer(), nullable=False),
        sa.Column("parts_sent", sa.Integer(), nullable=False),
        sa.Column("response_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.String(length=500), nullable=True),
        sa.Column("attempt_log", sa.JSON(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["batch_id"],
            ["alert_delivery.id"],
            name=op.f("fk_alert_delivery_batch_id_alert_delivery"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_delivery")),
        sa.UniqueConstraint("dedupe_key", name=op.f("uq_alert_delivery_dedupe_key")),
    )
    with op.batch_alter_table("alert_delivery", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_alert_delivery_due_at"), ["due_at"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_alert_delivery_incident_id"), ["incident_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_alert_delivery_state"), ["state"], unique=False)
        batch_op.create_index(
            "ix_alert_delivery_incident_channel_state",
            ["incident_id", "channel", "state"],
            unique=False,
        )


def downgrade() -> None:
    with op.batch_alter_table("alert_delivery", schema=None) as batch_op:
        batch_op.drop_index("ix_alert_delivery_incident_channel_state")
        batch_op.drop_index(batch_op.f("ix_alert_delivery_state"))
        batch_op.drop_index(batch_op.f("ix_alert_delivery_incident_id"))
        batch_op.drop_index(batch_op.f("ix_alert_delivery_due_at"))
    op.drop_table("alert_delivery")
