"""Circuit breakers on automation: list, and reset (approver)."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import ApproverUser, SessionDep, ViewerUser
from app.guardrails import breaker
from app.guardrails.public import BreakerPublic, BreakerResetIn
from app.incidents import breaker_reset
from app.models.guardrails import CircuitBreaker

router = APIRouter(prefix="/api/v1/breakers", tags=["guard-rails"])


def _public(row: CircuitBreaker) -> BreakerPublic:
    return BreakerPublic.model_validate(row, from_attributes=True)


@router.get(
    "", response_model=list[BreakerPublic], summary="Breakers that ever tripped, open first"
)
def list_breakers(session: SessionDep, _user: ViewerUser) -> list[BreakerPublic]:
    return [_public(r) for r in breaker.list_breakers(session)]


@router.post(
    "/{scope}/reset",
    response_model=BreakerPublic,
    summary="Reset an open breaker (scope: cluster or job:<name>): automation resumes",
)
def reset_breaker(
    scope: str, session: SessionDep, user: ApproverUser, body: BreakerResetIn | None = None
) -> BreakerPublic:
    row = breaker_reset.reset_breaker(
        session, scope=scope, actor=f"user:{user.name}", comment=body.comment if body else ""
    )
    session.commit()
    return _public(row)
