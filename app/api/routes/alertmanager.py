"""Prometheus Alertmanager webhook (version 4): alerts become fault signals."""

from __future__ import annotations

from fastapi import APIRouter, Request

from app.api.deps import OperatorUser, SessionDep
from app.auth.audit import record_audit
from app.core.errors import InvalidInput, Unavailable
from app.policy.detectors.external import (
    AlertmanagerAck,
    AlertmanagerPayload,
    AlertMappingError,
    map_alert,
)

router = APIRouter(prefix="/api/v1/alertmanager", tags=["alertmanager"])


@router.post("", response_model=AlertmanagerAck, summary="Alertmanager webhook receiver (v4)")
def receive(
    payload: AlertmanagerPayload, request: Request, session: SessionDep, user: OperatorUser
) -> AlertmanagerAck:
    sched = getattr(request.app.state, "policy_scheduler", None)
    if sched is None:
        raise Unavailable(
            "the policy scheduler is not running in this server; alerts cannot be taken"
        )
    try:
        mapped = [map_alert(a, sched.policy.alertmanager) for a in payload.alerts]
    except AlertMappingError as exc:
        raise InvalidInput(str(exc)) from None
    fired, resolved = sched.external.apply(mapped)
    record_audit(
        session,
        actor=f"user:{user.name}",
        action="alertmanager.webhook",
        target=payload.receiver[:200],  # audit_event.target is 200 characters
        detail={"firing": fired, "resolved": resolved, "group": payload.groupKey[:200]},
    )
    session.commit()
    return AlertmanagerAck(firing=fired, resolved=resolved)
