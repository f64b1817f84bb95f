"""Approvals of heavy-tier recovery plans: the queue, approve, reject (approver or admin)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.api.deps import ApproverUser, RowCount, RowId, SessionDep, ViewerUser
from app.incidents import approvals
from app.incidents.public import ApprovalDecisionIn, ApprovalPublic

router = APIRouter(prefix="/api/v1/approvals", tags=["approvals"])


@router.get("", response_model=list[ApprovalPublic], summary="Approvals (default: pending)")
def list_approvals(
    session: SessionDep,
    _user: ViewerUser,
    status: str = Query("pending", description="pending, approved, rejected, expired or all"),
    limit: Annotated[RowCount, Query()] = 100,
) -> list[ApprovalPublic]:
    return approvals.list_approvals(session, status=status, limit=limit)


def _decide(
    session: SessionDep,
    user: ApproverUser,
    approval_id: RowId,
    body: ApprovalDecisionIn | None,
    approve: bool,
) -> ApprovalPublic:
    result = approvals.decide(
        session,
        approval_id=approval_id,
        user=user,
        approve=approve,
        comment=(body.comment if body else ""),
    )
    session.commit()
    return result


@router.post(
    "/{approval_id}/approve",
    response_model=ApprovalPublic,
    summary="Approve: the waiting actions run",
)
def approve(
    approval_id: RowId,
    session: SessionDep,
    user: ApproverUser,
    body: ApprovalDecisionIn | None = None,
) -> ApprovalPublic:
    return _decide(session, user, approval_id, body, True)


@router.post(
    "/{approval_id}/reject",
    response_model=ApprovalPublic,
    summary="Reject: nothing runs, the job stays in SAFE_MODE",
)
def reject(
    approval_id: RowId,
    session: SessionDep,
    user: ApproverUser,
    body: ApprovalDecisionIn | None = None,
) -> ApprovalPublic:
    return _decide(session, user, approval_id, body, False)
