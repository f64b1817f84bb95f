"""drill: rlguard drill's record, from the request to its report (issue 42 item 4)

Revision ID: 0016_drills
Revises: 0015_token_job_scope
Create Date: 2026-12-06 00:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016_drills"
down_revision: str | Sequence[str] | None = "0015_token_job_scope"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "drill",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job", sa.String(length=128), nullable=False),
        sa.Column("role", sa.String(length=64), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("fault", sa.String(length=16), nullable=False),
        sa.Column("at_step", sa.Integer(), nullable=True),
        sa.Column("plan", sa.Boolean(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("requested_by", sa.String(length=160), nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("injected_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("target_pid", sa.Integer(), nullable=True),
        sa.Column("step_at_injection", sa.Integer(), nullable=True),
        sa.Column("reason", sa.String(length=1000), nullable=False),
        sa.Column("answer", sa.JSON(), nullable=False),
        sa.Column("incident_ids", sa.JSON(), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("report", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_drill")),
    )
    with op.batch_alter_table("drill", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_drill_job"), ["job"], unique=False)
        batch_op.create_index(batch_op.f("ix_drill_status"), ["status"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("drill", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_drill_status"))
        batch_op.drop_index(batch_op.f("ix_drill_job"))
    op.drop_table("drill")
