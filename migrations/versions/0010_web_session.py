"""server-side dashboard sessions (issue 17 item 2: logout, password change and disable end them)

Revision ID: 0010_web_session
Revises: 0009_phase_transition
Create Date: 2026-12-01 20:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_web_session"
down_revision: str | Sequence[str] | None = "0009_phase_transition"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "web_session",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("client", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["user_id"], ["user_account.id"], name=op.f("fk_web_session_user_id_user_account")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_web_session")),
    )
    with op.batch_alter_table("web_session", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_web_session_token_hash"), ["token_hash"], unique=True)
        batch_op.create_index(batch_op.f("ix_web_session_user_id"), ["user_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_web_session_expires_at"), ["expires_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("web_session", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_web_session_expires_at"))
        batch_op.drop_index(batch_op.f("ix_web_session_user_id"))
        batch_op.drop_index(batch_op.f("ix_web_session_token_hash"))
    op.drop_table("web_session")
