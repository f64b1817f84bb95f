"""Hang forensics on the incident: the Python stacks its restart captured, one timeline entry
per process (``stacks_captured``), with the text or the reason there is none.

The stacks come from the process's launcher on its node (``py-spy dump``, through the launcher
hook: ``app.tasks.recovery_adapters.restart_role``) and are written here *before* the restart
is asked for, so the incident shows where the process hung even while its restart waits
(backoff, SAFE_MODE) or fails. A capture that failed is recorded the same way, with its
reason: the operator learns why there are no stacks instead of finding none.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlmodel import Session, select

from app.incidents.timeline import add_event
from app.models.incident import IncidentEvent, IncidentEventType
from recovery.supervision.stacks import DEFAULT_MAX_BYTES, truncate

# What the incident keeps of one capture's failure reason.
_MAX_REASON = 2000


def _text(value: Any, limit: int) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _captured_at(value: Any, now: datetime) -> str:
    if isinstance(value, int | float) and value > 0:
        return datetime.fromtimestamp(float(value), UTC).isoformat()
    return now.isoformat()


def stacks_detail(
    capture: dict[str, Any], *, action_id: int, node: str | None, max_bytes: int, now: datetime
) -> dict[str, Any]:
    """One capture as the launcher answered it → the timeline entry's detail, bounded: the text
    is cut again at ``max_bytes`` (the launcher already did; the row must not trust it)."""
    text, cut = truncate(capture.get("text") or "", max_bytes) if capture.get("ok") else ("", False)
    ok = bool(capture.get("ok")) and bool(text)
    reason = _text(capture.get("reason"), _MAX_REASON)
    if not ok and not reason:
        reason = "the launcher returned no stacks"
    pid = capture.get("pid")
    return {
        "action_id": action_id,
        "node": node,
        "role": capture.get("role"),
        "rank": capture.get("rank"),
        "pid": pid if isinstance(pid, int) else None,
        "ok": ok,
        "reason": "" if ok else reason,
        "captured_at": _captured_at(capture.get("captured_at"), now),
        "truncated": bool(capture.get("truncated")) or cut,
        "nonblocking": bool(capture.get("nonblocking")),
        "text": text,
    }


def record_stacks(
    session: Session,
    *,
    incident_id: int,
    action_id: int,
    node: str | None,
    captures: Sequence[dict[str, Any]],
    actor: str,
    now: datetime,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> int:
    """Add one ``stacks_captured`` entry per capture of action ``action_id``; the number added.

    Once per action: a retried restart (the hook timed out and the task runs again) gets the
    same answer from the launcher and must not add the stacks twice. The caller commits.
    """
    earlier = session.exec(
        select(IncidentEvent.detail).where(
            IncidentEvent.incident_id == incident_id,
            IncidentEvent.type == IncidentEventType.STACKS_CAPTURED.value,
        )
    ).all()
    if any(d.get("action_id") == action_id for d in earlier):
        return 0
    for capture in captures:
        add_event(
            session,
            incident_id=incident_id,
            type_=IncidentEventType.STACKS_CAPTURED,
            actor=actor,
            at=now,
            detail=stacks_detail(
                capture, action_id=action_id, node=node, max_bytes=max_bytes, now=now
            ),
        )
    return len(captures)
