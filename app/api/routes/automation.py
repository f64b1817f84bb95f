"""A job's automation switches: dry run and hands off (GET viewer; PUT operator for dry run,
approver for hands off; audited)."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import OperatorUser, SessionDep, ViewerUser
from app.guardrails import automation
from app.guardrails.public import JobAutomationIn, JobAutomationPublic
from app.models.guardrails import JobAutomation

router = APIRouter(prefix="/api/v1/jobs", tags=["guard-rails"])


def _public(row: JobAutomation) -> JobAutomationPublic:
    return JobAutomationPublic(
        job=row.job_name,
        dry_run=row.dry_run,
        hands_off=row.hands_off,
        updated_at=row.updated_at if row.updated_by else None,
        updated_by=row.updated_by,
    )


@router.get(
    "/{job}/automation",
    response_model=JobAutomationPublic,
    summary="The job's automation switches (dry run, hands off)",
)
def get_automation(job: str, session: SessionDep, _user: ViewerUser) -> JobAutomationPublic:
    return _public(automation.get_job_automation(session, job=job))


@router.put(
    "/{job}/automation",
    response_model=JobAutomationPublic,
    summary="Change the job's switches (dry run: operator; hands off: approver)",
)
def put_automation(
    job: str, body: JobAutomationIn, session: SessionDep, user: OperatorUser
) -> JobAutomationPublic:
    row = automation.set_job_automation(
        session,
        job=job,
        user=user,
        dry_run=body.dry_run,
        hands_off=body.hands_off,
        reason=body.reason,
    )
    session.commit()
    return _public(row)
