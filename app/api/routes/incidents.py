"""Incidents: list and detail (timeline, evidence, signals, actions, approvals)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.api.deps import RowCount, RowId, SessionDep, ViewerUser
from app.incidents import queries
from app.incidents.public import IncidentDetail, IncidentsPublic

router = APIRouter(prefix="/api/v1/incidents", tags=["incidents"])


@router.get("", response_model=IncidentsPublic, summary="Incidents, newest first")
def list_incidents(
    session: SessionDep,
    _user: ViewerUser,
    status: str = Query("all", description="open, resolved or all"),
    tier: str | None = Query(None, description="light, medium or heavy"),
    job: str | None = Query(None, max_length=128),
    limit: Annotated[RowCount, Query()] = 100,
    offset: Annotated[RowCount, Query()] = 0,
) -> IncidentsPublic:
    return queries.list_incidents(
        session, status=status, tier=tier, job=job, limit=limit, offset=offset
    )


@router.get(
    "/{incident_id}", response_model=IncidentDetail, summary="One incident with its timeline"
)
def get_incident(incident_id: RowId, session: SessionDep, _user: ViewerUser) -> IncidentDetail:
    return queries.incident_detail(session, incident_id=incident_id)
