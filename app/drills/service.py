"""A drill's record: created (checked, audited), read, listed, and waited on while the node's
launcher answers. The routes and the CLI call these; nothing here talks to a launcher."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app.auth.audit import record_audit
from app.core.config import DrillSettings
from app.core.errors import InvalidInput, NotFound
from app.drills.public import DrillCreate, DrillPublic
from app.drills.rules import check_request
from app.models.drill import Drill, DrillStatus

# What RLGuard does about each fault with the shipped policy (policy.yaml); a plan says it so
# that an operator knows what to watch for. A site's own policy may differ: the report says
# what really happened.
EXPECTED = {
    "kill": "its launcher reports the exit at once: heartbeat_lost (medium) opens and RLGuard "
    "restarts only that process (restart_role); in the job's first step it is heavy "
    "instead (first-step anomaly: SAFE_MODE, a whole-job restart waits for an approver)",
    "hang": "its heartbeat goes silent: suspected, then confirmed after the policy's windows: "
    "heartbeat_lost (medium) opens, its Python stacks are captured and the process is "
    "restarted (restart_role)",
    "oom": "the step fails with a CUDA out-of-memory error: the step is recorded and skipped "
    "(light), training goes on without a restart",
    "disk-full": "the checkpoint write fails: storage_unwritable (heavy) puts the job in "
    "SAFE_MODE and the restore waits for an approver",
}
_POLL_SECONDS = 0.2


def request_drill(
    session: Session, body: DrillCreate, *, actor: str, now: datetime, settings: DrillSettings
) -> Drill:
    """Check ``body`` (raises naming the bad value, nothing written) and add the drill with its
    audit row; the caller commits, then sends it (:func:`app.drills.dispatch.send_injection`)."""
    longest = settings.arm_timeout_seconds + settings.follow_timeout_seconds
    target = check_request(session, body, in_flight_after=now - timedelta(seconds=longest))
    row = Drill(
        job=target.job,
        role=target.role,
        rank=target.rank,
        node=target.node,
        fault=target.fault,
        at_step=target.at_step,
        plan=body.plan,
        status=DrillStatus.requested.value,
        requested_by=actor,
        requested_at=now,
    )
    session.add(row)
    session.flush()
    record_audit(
        session,
        actor=actor,
        action="drill.plan" if body.plan else "drill.request",
        target=f"job:{target.job}",
        detail={
            "drill": row.id,
            "fault": target.fault,
            "role": target.role,
            "rank": target.rank,
            "node": target.node,
            "at_step": target.at_step,
        },
    )
    return row


def mark_undeliverable(session: Session, drill_id: int, reason: str) -> Drill:
    """The broker did not take the drill: refused, nothing injected."""
    row = get_drill(session, drill_id)
    if row.status == DrillStatus.requested.value:
        row.status = DrillStatus.refused.value
        row.reason = reason[:1000]
        session.add(row)
    return row


def get_drill(session: Session, drill_id: int) -> Drill:
    row = session.get(Drill, drill_id)
    if row is None:
        raise NotFound(f"no drill {drill_id}")
    return row


def list_drills(
    session: Session, *, job: str | None = None, plans: bool = False, limit: int = 100
) -> list[Drill]:
    """Past and running drills, newest first (plans only when asked for)."""
    query = select(Drill).order_by(col(Drill.id).desc()).limit(limit)
    if job is not None:
        query = query.where(Drill.job == job)
    if not plans:
        query = query.where(col(Drill.plan).is_(False))
    return list(session.exec(query).all())


def wait_for_answer(engine: Engine, drill_id: int, *, timeout: float) -> Drill:
    """The drill once its launcher answered (or still ``requested`` after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        with Session(engine, expire_on_commit=False) as session:
            row = get_drill(session, drill_id)
        if row.status != DrillStatus.requested.value or time.monotonic() >= deadline:
            return row
        time.sleep(_POLL_SECONDS)


def raise_if_refused(row: Drill) -> None:
    """A drill its launcher refused is the request's error (422, the launcher's reason)."""
    if row.status == DrillStatus.refused.value:
        raise InvalidInput(f"drill {row.id} refused: {row.reason}; nothing injected")


def drill_public(row: Drill) -> DrillPublic:
    assert row.id is not None
    what = row.answer.get("what") if isinstance(row.answer, dict) else None
    return DrillPublic(
        id=row.id,
        job=row.job,
        role=row.role,
        rank=row.rank,
        node=row.node,
        fault=row.fault,
        at_step=row.at_step,
        plan=row.plan,
        status=row.status,
        requested_by=row.requested_by,
        requested_at=row.requested_at,
        injected_at=row.injected_at,
        target_pid=row.target_pid,
        step_at_injection=row.step_at_injection,
        reason=row.reason,
        what=str(what or ""),
        expected=EXPECTED.get(row.fault, ""),
        incident_ids=list(row.incident_ids or []),
        finished_at=row.finished_at,
        report=dict(row.report or {}),
    )
