"""Durable ingest dedupe state: which (agent_id, seq) batches were applied."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from app.models._types import UTCDateTime, utcnow


class IngestCursor(SQLModel, table=True):
    """Per agent: the highest applied ``seq`` and a bitmap of the 62 seqs just below it.

    Bit ``i`` of ``window_mask`` set means ``high_seq - i`` was applied (bit 0 is ``high_seq``
    itself). A seq below the window counts as already applied. See ``app.ingest.dedupe``.
    """

    __tablename__ = "ingest_cursor"

    # Keyed by node too: a token may only ingest for its own node, so one node's agent can never
    # advance (and thereby block) another node's sequence numbers.
    node_name: str = Field(primary_key=True, max_length=128)
    agent_id: str = Field(primary_key=True, max_length=128)
    high_seq: int = Field(sa_type=sa.BigInteger)
    window_mask: int = Field(sa_type=sa.BigInteger)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
