"""foundation schema

Revision ID: 0001_foundation
Revises:
Create Date: 2026-11-29 15:24:06.415273
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001_foundation"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "audit_event",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=160), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("target", sa.String(length=200), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_event")),
    )
    with op.batch_alter_table("audit_event", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_audit_event_action"), ["action"], unique=False)
        batch_op.create_index(batch_op.f("ix_audit_event_at"), ["at"], unique=False)

    op.create_table(
        "ingest_cursor",
        sa.Column("node_name", sa.String(length=128), nullable=False),
        sa.Column("agent_id", sa.String(length=128), nullable=False),
        sa.Column("high_seq", sa.BigInteger(), nullable=False),
        sa.Column("window_mask", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("node_name", "agent_id", name=op.f("pk_ingest_cursor")),
    )
    op.create_table(
        "job",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job")),
    )
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_name"), ["name"], unique=True)

    op.create_table(
        "metric_rollup",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("series_id", sa.String(length=40), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("minute", sa.DateTime(timezone=True), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("min", sa.Float(), nullable=False),
        sa.Column("max", sa.Float(), nullable=False),
        sa.Column("avg", sa.Float(), nullable=False),
        sa.Column("last", sa.Float(), nullable=False),
        sa.Column("last_ts", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_metric_rollup")),
        sa.UniqueConstraint("series_id", "minute", name=op.f("uq_metric_rollup_series_id_minute")),
    )
    with op.batch_alter_table("metric_rollup", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_metric_rollup_minute"), ["minute"], unique=False)
        batch_op.create_index(
            "ix_metric_rollup_node_name_minute", ["node", "name", "minute"], unique=False
        )

    op.create_table(
        "node",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_agent_id", sa.String(length=128), nullable=True),
        sa.Column("fingerprint", sa.JSON(), nullable=True),
        sa.Column("fingerprint_hash", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_node")),
    )
    with op.batch_alter_table("node", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_node_name"), ["name"], unique=True)

    op.create_table(
        "user_account",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("password_hash", sa.String(length=256), nullable=True),
        sa.Column("disabled", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_user_account")),
    )
    with op.batch_alter_table("user_account", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_user_account_name"), ["name"], unique=True)

    op.create_table(
        "api_token",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("node_name", sa.String(length=128), nullable=True),
        sa.Column("user_id", sa.Integer(), nullable=True),
        sa.Column("description", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["node_name"], ["node.name"], name=op.f("fk_api_token_node_name_node")
        ),
        sa.ForeignKeyConstraint(
            ["user_id"], ["user_account.id"], name=op.f("fk_api_token_user_id_user_account")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_token")),
    )
    with op.batch_alter_table("api_token", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_token_token_hash"), ["token_hash"], unique=True)
        batch_op.create_index(batch_op.f("ix_api_token_user_id"), ["user_id"], unique=False)

    op.create_table(
        "participant",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_name", sa.String(length=128), nullable=False),
        sa.Column("role", sa.String(length=64), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("node_name", sa.String(length=128), nullable=True),
        sa.Column("phase", sa.String(length=64), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("last_heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_name"], ["job.name"], name=op.f("fk_participant_job_name_job"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["node_name"], ["node.name"], name=op.f("fk_participant_node_name_node")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_participant")),
        sa.UniqueConstraint(
            "job_name", "role", "rank", name=op.f("uq_participant_job_name_role_rank")
        ),
    )
    with op.batch_alter_table("participant", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_participant_job_name"), ["job_name"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("participant", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_participant_job_name"))

    op.drop_table("participant")
    with op.batch_alter_table("api_token", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_token_user_id"))
        batch_op.drop_index(batch_op.f("ix_api_token_token_hash"))

    op.drop_table("api_token")
    with op.batch_alter_table("user_account", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_user_account_name"))

    op.drop_table("user_account")
    with op.batch_alter_table("node", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_node_name"))

    op.drop_table("node")
    with op.batch_alter_table("metric_rollup", schema=None) as batch_op:
        batch_op.drop_index("ix_metric_rollup_node_name_minute")
        batch_op.drop_index(batch_op.f("ix_metric_rollup_minute"))

    op.drop_table("metric_rollup")
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_name"))

    op.drop_table("job")
    op.drop_table("ingest_cursor")
    with op.batch_alter_table("audit_event", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_audit_event_at"))
        batch_op.drop_index(batch_op.f("ix_audit_event_action"))

    op.drop_table("audit_event")
