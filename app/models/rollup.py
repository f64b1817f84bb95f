"""Per-minute aggregates of every series, written in the background from the series store."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from app.models._types import UTCDateTime


class MetricRollup(SQLModel, table=True):
    """min/max/avg/last of one series over one minute.

    ``series_id`` is a hash of (node, name, sorted labels) so the unique key stays short on every
    backend; ``labels`` keeps the readable form.
    """

    __tablename__ = "metric_rollup"
    __table_args__ = (
        sa.UniqueConstraint("series_id", "minute"),
        sa.Index("ix_metric_rollup_node_name_minute", "node", "name", "minute"),
        # One metric over a time range, every node (the goodput ledger's checkpoints, the
        # overview's sparklines): without it the minute index alone scanned every series of the
        # window, 8 times per Overview view (profiled at 1,000 nodes: 97 % of the page's time).
        sa.Index("ix_metric_rollup_name_minute", "name", "minute"),
    )

    id: int | None = Field(default=None, primary_key=True)
    series_id: str = Field(max_length=40)
    node: str = Field(max_length=128)
    name: str = Field(max_length=200)
    labels: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)
    minute: datetime = Field(sa_type=UTCDateTime, index=True)
    count: int
    min: float
    max: float
    avg: float
    last: float
    last_ts: float
