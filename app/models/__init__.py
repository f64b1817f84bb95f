"""SQLModel tables. Importing this package registers every table on ``SQLModel.metadata``."""

from __future__ import annotations

from app.models._base import metadata
from app.models._types import UTCDateTime, from_epoch, utcnow
from app.models.audit import AuditEvent
from app.models.auth import ApiToken, Role, TokenKind, User, WebSession
from app.models.cluster import Job, Node, Participant
from app.models.ingest import IngestCursor
from app.models.rollup import MetricRollup

__all__ = [
    "ApiToken",
    "AuditEvent",
    "IngestCursor",
    "Job",
    "MetricRollup",
    "Node",
    "Participant",
    "Role",
    "TokenKind",
    "UTCDateTime",
    "User",
    "WebSession",
    "from_epoch",
    "metadata",
    "utcnow",
]
