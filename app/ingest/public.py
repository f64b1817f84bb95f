"""The REST API's answer to an ingest batch."""

from __future__ import annotations

from pydantic import BaseModel


class IngestAck(BaseModel):
    accepted: int
    duplicate: bool
