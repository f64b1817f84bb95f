"""Silences: operators create and expire them, viewers list them.
Validation, audit and state live in app.silences.store; this module parses and shapes."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import OperatorUser, RowId, SessionDep, SettingsDep, ViewerUser
from app.models._types import utcnow
from app.silences import store
from app.silences.public import SilenceCreate, SilencePublic

router = APIRouter(prefix="/api/v1/silences", tags=["silences"])


@router.get("", response_model=list[SilencePublic], summary="Silences, newest first")
def list_silences(
    session: SessionDep, _viewer: ViewerUser, active: bool = False
) -> list[SilencePublic]:
    now = utcnow()
    rows = store.list_silences(session, now=now, active_only=active)
    return [store.silence_public(r, now) for r in rows]


@router.post(
    "",
    response_model=SilencePublic,
    status_code=201,
    summary="Silence the alerts (and, if asked, the actions) of what the matchers match",
)
def create_silence(
    body: SilenceCreate, session: SessionDep, settings: SettingsDep, operator: OperatorUser
) -> SilencePublic:
    now = utcnow()
    row = store.create_silence(
        session,
        body,
        author=f"user:{operator.name}",
        max_hours=settings.silences.max_duration_hours,
        now=now,
        max_regex_chars=settings.silences.max_regex_chars,
    )
    session.commit()
    return store.silence_public(row, now)


@router.post("/{silence_id}/expire", response_model=SilencePublic, summary="End a silence now")
def expire_silence(silence_id: RowId, session: SessionDep, operator: OperatorUser) -> SilencePublic:
    now = utcnow()
    row = store.expire_silence(session, silence_id, actor=f"user:{operator.name}", now=now)
    session.commit()
    return store.silence_public(row, now)
