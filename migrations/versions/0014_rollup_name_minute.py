"""metric_rollup index on (name, minute): one metric over a time range, every node

The goodput ledger reads a job's checkpoints as ``name = 'checkpoint_committed_step' AND minute
in a window``; with only the (minute) and (node, name, minute) indexes that scanned every series
of the window (1.2 M rows at 1,000 nodes x 8 GPUs over 30 minutes), twice per job per Overview
view (benchmarks/dashboard.py, issue 24).

Revision ID: 0014_rollup_name_minute
Revises: 0013_silences
Create Date: 2026-12-02 12:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0014_rollup_name_minute"
down_revision: str | Sequence[str] | None = "0013_silences"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A plain CREATE INDEX on both backends (no batch mode: nothing about the table changes).
    op.create_index("ix_metric_rollup_name_minute", "metric_rollup", ["name", "minute"])


def downgrade() -> None:
    op.drop_index("ix_metric_rollup_name_minute", table_name="metric_rollup")
