"""Jobs: list and detail (participants with phase and heartbeat age)."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import SessionDep, ViewerUser
from app.models.public import JobDetail, JobsPublic
from app.services import cluster

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])


@router.get("", response_model=JobsPublic, summary="All jobs with participant counts per phase")
def list_jobs(session: SessionDep, _user: ViewerUser) -> JobsPublic:
    jobs = cluster.list_jobs(session)
    return JobsPublic(data=jobs, count=len(jobs))


@router.get("/{job}", response_model=JobDetail, summary="One job's participants")
def get_job(job: str, session: SessionDep, _user: ViewerUser) -> JobDetail:
    return cluster.job_detail(session, name=job)
