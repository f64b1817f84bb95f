"""step progress of job participants (issue 23, the goodput ledger)

Revision ID: 0011_step_progress
Revises: 0010_web_session
Create Date: 2026-12-01 20:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_step_progress"
down_revision: str | Sequence[str] | None = "0010_web_session"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "step_progress",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_name", sa.String(length=128), nullable=False),
        sa.Column("role", sa.String(length=64), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_name"],
            ["job.name"],
            name=op.f("fk_step_progress_job_name_job"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_step_progress")),
        sa.UniqueConstraint(
            "job_name", "role", "rank", "at", name=op.f("uq_step_progress_job_name_role_rank_at")
        ),
    )
    with op.batch_alter_table("step_progress", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_step_progress_at"), ["at"], unique=False)
        batch_op.create_index("ix_step_progress_job_name_at", ["job_name", "at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("step_progress", schema=None) as batch_op:
        batch_op.drop_index("ix_step_progress_job_name_at")
        batch_op.drop_index(batch_op.f("ix_step_progress_at"))
    op.drop_table("step_progress")
