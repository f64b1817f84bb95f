"""api_token.job_patterns: a node token scoped to job-name patterns (issue 41 item 7)

NULL is an unscoped token (any job, as before); otherwise a JSON list of glob patterns
(``team-a-*``) that every job a batch names must match (``app/auth/job_scope.py``).

Revision ID: 0015_token_job_scope
Revises: 0014_rollup_name_minute
Create Date: 2026-12-05 21:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015_token_job_scope"
down_revision: str | Sequence[str] | None = "0014_rollup_name_minute"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("api_token", schema=None) as batch_op:
        batch_op.add_column(sa.Column("job_patterns", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_token", schema=None) as batch_op:
        batch_op.drop_column("job_patterns")
