"""phase transitions of job participants (issue 9, Job page timeline)

Revision ID: 0009_phase_transition
Revises: 0008_alert_delivery
Create Date: 2026-11-29 16:50:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_phase_transition"
down_revision: str | Sequence[str] | None = "0008_alert_delivery"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "phase_transition",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_name", sa.String(length=128), nullable=False),
        sa.Column("role", sa.String(length=64), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("node_name", sa.String(length=128), nullable=True),
        sa.Column("phase", sa.String(length=64), nullable=False),
        sa.Column("previous_phase", sa.String(length=64), nullable=True),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_name"],
            ["job.name"],
            name=op.f("fk_phase_transition_job_name_job"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_phase_transition")),
        sa.UniqueConstraint(
            "job_name", "role", "rank", "at", name=op.f("uq_phase_transition_job_name_role_rank_at")
        ),
    )
    with op.batch_alter_table("phase_transition", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_phase_transition_at"), ["at"], unique=False)
        batch_op.create_index("ix_phase_transition_job_name_at", ["job_name", "at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("phase_transition", schema=None) as batch_op:
        batch_op.drop_index("ix_phase_transition_job_name_at")
        batch_op.drop_index(batch_op.f("ix_phase_transition_at"))
    op.drop_table("phase_transition")
