"""guard-rails on automation: circuit breakers, job automation switches, action backoff (issue 20)

Revision ID: 0012_guardrails
Revises: 0011_step_progress
Create Date: 2026-12-02 04:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_guardrails"
down_revision: str | Sequence[str] | None = "0011_step_progress"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "circuit_breaker",
        sa.Column("scope", sa.String(length=160), nullable=False),
        sa.Column("open", sa.Boolean(), nullable=False),
        sa.Column("tripped_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reason", sa.String(length=500), nullable=False),
        sa.Column("incident_id", sa.Integer(), nullable=True),
        sa.Column("trips", sa.Integer(), nullable=False),
        sa.Column("reset_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reset_by", sa.String(length=160), nullable=True),
        sa.ForeignKeyConstraint(
            ["incident_id"],
            ["incident.id"],
            name=op.f("fk_circuit_breaker_incident_id_incident"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("scope", name=op.f("pk_circuit_breaker")),
    )
    op.create_table(
        "job_automation",
        sa.Column("job_name", sa.String(length=128), nullable=False),
        sa.Column("dry_run", sa.Boolean(), nullable=False),
        sa.Column("hands_off", sa.Boolean(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_by", sa.String(length=160), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_name"],
            ["job.name"],
            name=op.f("fk_job_automation_job_name_job"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_name", name=op.f("pk_job_automation")),
    )
    with op.batch_alter_table("recovery_action", schema=None) as batch_op:
        batch_op.add_column(sa.Column("not_before", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("recovery_action", schema=None) as batch_op:
        batch_op.drop_column("not_before")
    op.drop_table("job_automation")
    op.drop_table("circuit_breaker")
