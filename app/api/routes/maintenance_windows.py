"""Maintenance windows: operators create and expire them, viewers list them.
Validation, audit and state live in app.silences.store; this module parses and shapes."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import OperatorUser, RowId, SessionDep, SettingsDep, ViewerUser
from app.models._types import utcnow
from app.silences import store
from app.silences.public import MaintenanceWindowCreate, MaintenanceWindowPublic

router = APIRouter(prefix="/api/v1/maintenance-windows", tags=["silences"])


@router.get(
    "", response_model=list[MaintenanceWindowPublic], summary="Maintenance windows, newest first"
)
def list_windows(session: SessionDep, _viewer: ViewerUser) -> list[MaintenanceWindowPublic]:
    now = utcnow()
    return [store.window_public(r, now) for r in store.list_windows(session)]


@router.post(
    "",
    response_model=MaintenanceWindowPublic,
    status_code=201,
    summary="A one-off or weekly window: no silence alerts and no actions for a node or job",
)
def create_window(
    body: MaintenanceWindowCreate,
    session: SessionDep,
    settings: SettingsDep,
    operator: OperatorUser,
) -> MaintenanceWindowPublic:
    now = utcnow()
    row = store.create_window(
        session,
        body,
        author=f"user:{operator.name}",
        max_hours=settings.silences.max_duration_hours,
        now=now,
    )
    session.commit()
    return store.window_public(row, now)


@router.post(
    "/{window_id}/expire",
    response_model=MaintenanceWindowPublic,
    summary="End a maintenance window now (and its future occurrences)",
)
def expire_window(
    window_id: RowId, session: SessionDep, operator: OperatorUser
) -> MaintenanceWindowPublic:
    now = utcnow()
    row = store.expire_window(session, window_id, actor=f"user:{operator.name}", now=now)
    session.commit()
    return store.window_public(row, now)
