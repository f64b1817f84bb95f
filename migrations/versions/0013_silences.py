"""silences and maintenance windows (issue 20, guard-rails for automation)

Revision ID: 0013_silences
Revises: 0012_guardrails
Create Date: 2026-12-02 04:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_silences"
down_revision: str | Sequence[str] | None = "0012_guardrails"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "silence",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("matchers", sa.JSON(), nullable=False),
        sa.Column("starts_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ends_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("author", sa.String(length=160), nullable=False),
        sa.Column("comment", sa.String(length=500), nullable=False),
        sa.Column("stops_actions", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expired_by", sa.String(length=160), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_silence")),
    )
    with op.batch_alter_table("silence", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_silence_ends_at"), ["ends_at"], unique=False)
    op.create_table(
        "maintenance_window",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=True),
        sa.Column("job", sa.String(length=128), nullable=True),
        sa.Column("recurrence", sa.String(length=16), nullable=False),
        sa.Column("starts_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ends_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("weekday", sa.Integer(), nullable=True),
        sa.Column("start_minute", sa.Integer(), nullable=True),
        sa.Column("duration_minutes", sa.Integer(), nullable=True),
        sa.Column("author", sa.String(length=160), nullable=False),
        sa.Column("comment", sa.String(length=500), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expired_by", sa.String(length=160), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_maintenance_window")),
    )


def downgrade() -> None:
    op.drop_table("maintenance_window")
    with op.batch_alter_table("silence", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_silence_ends_at"))
    op.drop_table("silence")
