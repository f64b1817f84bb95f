"""Jobs: list, detail (participants with phase and heartbeat age), phase history, release from
SAFE_MODE."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query

from app.api.deps import ApproverUser, SessionDep, ViewerUser
from app.cluster import phase_history
from app.cluster import queries as cluster
from app.cluster.public import JobDetail, JobsPublic, PhaseHistoryPublic
from app.incidents import safe_mode_release
from app.incidents.public import JobReleaseIn, JobReleasePublic
from app.models import utcnow

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])


@router.get("", response_model=JobsPublic, summary="All jobs with participant counts per phase")
def list_jobs(session: SessionDep, _user: ViewerUser) -> JobsPublic:
    jobs = cluster.list_jobs(session)
    return JobsPublic(data=jobs, count=len(jobs))


@router.get("/{job}", response_model=JobDetail, summary="One job's participants")
def get_job(job: str, session: SessionDep, _user: ViewerUser) -> JobDetail:
    return cluster.job_detail(session, name=job)


@router.get(
    "/{job}/phases",
    response_model=PhaseHistoryPublic,
    summary="Phase transitions of the job's participants (oldest first)",
)
def get_job_phases(
    job: str,
    session: SessionDep,
    _user: ViewerUser,
    since: Annotated[
        datetime | None,
        Query(
            description="ISO 8601 with a time zone (default: one hour ago); each participant's "
            "last transition before it comes first, so its phase at `since` is known"
        ),
    ] = None,
    limit: Annotated[
        int, Query(ge=1, le=phase_history.MAX_TRANSITIONS)
    ] = phase_history.MAX_TRANSITIONS,
) -> PhaseHistoryPublic:
    return phase_history.phase_history(session, job=job, now=utcnow(), since=since, limit=limit)


@router.post(
    "/{job}/release",
    response_model=JobReleasePublic,
    status_code=202,
    summary="Release a job from SAFE_MODE (approver or admin); its incident closes once done",
    description=(
        "Plans one `release_safe_mode` action per held node (the node's worker writes `run` "
        "into the job's control file). A job is held when an open incident put it in SAFE_MODE, "
        "or when its participants report phase SAFE_MODE with no incident (the control file "
        "was left in SAFE_MODE): then a `safe_mode_hold` incident records the release. 409 when "
        "the job is not held (the reason says what its participants report), an approval is "
        "still pending or a release is already on its way; 404 for an unknown job; 403 below "
        "the approver role."
    ),
)
def release_job(
    job: str, body: JobReleaseIn, session: SessionDep, user: ApproverUser
) -> JobReleasePublic:
    result = safe_mode_release.release_job(session, job=job, user=user, comment=body.comment)
    session.commit()
    return result
