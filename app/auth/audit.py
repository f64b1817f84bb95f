"""Audit log writes. The caller's session commits the row with the change it describes."""

from __future__ import annotations

from typing import Any

from sqlmodel import Session

from app.models import AuditEvent, Role

# Who may read the audit log, in the REST API (GET /api/v1/audit) and on the dashboard's /audit
# page alike: it names failed sign-ins, client addresses and token prefixes.
AUDIT_READER_ROLE = Role.admin


def record_audit(
    session: Session,
    *,
    actor: str,
    action: str,
    target: str = "",
    detail: dict[str, Any] | None = None,
) -> AuditEvent:
    """Add an audit row to ``session`` (committed, or rolled back, with the change itself)."""
    event = AuditEvent(actor=actor, action=action, target=target, detail=detail or {})
    session.add(event)
    return event
