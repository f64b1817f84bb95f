"""Alertmanager's API v2 subset that ``amtool`` and Grafana use for silences and alerts.

Mapped onto RLGuard's one silence store by ``app.silences.alertmanager``; this module parses,
calls it and shapes the answer. Authentication is RLGuard's: ``Authorization: Bearer <user
token>`` (amtool's ``--http.config.file`` with ``authorization: {credentials: ...}``); reading
needs the viewer role, writing the operator role, and every write is audited by the store.
Errors the service raises on purpose go out as Alertmanager sends them: a JSON string.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query
from fastapi.responses import JSONResponse

from app.api.deps import OperatorUser, SessionDep, SettingsDep, ViewerUser
from app.api.routes.alerts import AlertsConfigDep
from app.core.errors import ServiceError
from app.models._types import utcnow
from app.silences import alertmanager as am

router = APIRouter(prefix="/api/v2", tags=["alertmanager-v2"])

# Uptime as Alertmanager reports it: since this process started serving.
_STARTED = datetime.now(UTC)


def _am_error(err: ServiceError) -> JSONResponse:
    """Alertmanager answers a bad request with 400 and the reason as a JSON string."""
    status = 400 if err.status_code == 422 else err.status_code
    return JSONResponse(str(err), status_code=status)


@router.get("/status", summary="Alertmanager status (what amtool and Grafana probe)")
def status(_viewer: ViewerUser) -> dict[str, Any]:
    return {
        "cluster": {"status": "disabled", "peers": []},
        "versionInfo": {
            "version": "0.25.0-rlguard",
            "revision": "rlguard",
            "branch": "rlguard",
            "buildUser": "rlguard",
            "buildDate": "",
            "goVersion": "none",
        },
        "config": {"original": "# RLGuard serves Alertmanager's silences API; no routing tree\n"},
        "uptime": _STARTED.isoformat().replace("+00:00", "Z"),
    }


@router.get("/silences", summary="Silences (Alertmanager's shape)", response_model=None)
def list_silences(
    session: SessionDep,
    _viewer: ViewerUser,
    filter: Annotated[list[str] | None, Query()] = None,  # noqa: A002 - the API's name
) -> list[dict[str, Any]] | JSONResponse:
    try:
        return am.list_silences(session, filter or [], utcnow())
    except ServiceError as err:
        return _am_error(err)


@router.post("/silences", summary="Create or replace a silence", response_model=None)
def post_silence(
    body: Annotated[Any, Body()],
    session: SessionDep,
    settings: SettingsDep,
    operator: OperatorUser,
) -> dict[str, str] | JSONResponse:
    limits = am.SilenceLimits(
        max_hours=settings.silences.max_duration_hours,
        max_regex_chars=settings.silences.max_regex_chars,
    )
    try:
        silence = am.parse_postable(body)
        silence_id = am.post_silence(
            session, silence, author=f"user:{operator.name}", limits=limits, now=utcnow()
        )
    except ServiceError as err:
        session.rollback()
        return _am_error(err)
    session.commit()
    return {"silenceID": am.silence_uuid(silence_id)}


@router.get("/silence/{silence_id}", summary="One silence", response_model=None)
def get_silence(
    silence_id: str, session: SessionDep, _viewer: ViewerUser
) -> dict[str, Any] | JSONResponse:
    try:
        return am.get_silence(session, silence_id, utcnow())
    except ServiceError as err:
        return _am_error(err)


@router.delete("/silence/{silence_id}", summary="Expire a silence now", response_model=None)
def delete_silence(
    silence_id: str, session: SessionDep, operator: OperatorUser
) -> JSONResponse | None:
    try:
        am.expire_silence(session, silence_id, actor=f"user:{operator.name}", now=utcnow())
    except ServiceError as err:
        session.rollback()
        return _am_error(err)
    session.commit()
    return None


def _alerts(
    session: SessionDep,
    config: AlertsConfigDep,
    filters: list[str] | None,
    active: bool,
    silenced: bool,
    inhibited: bool,
) -> list[dict[str, Any]]:
    query = am.AlertQuery(
        filters=tuple(filters or ()), active=active, silenced=silenced, inhibited=inhibited
    )
    return am.list_alerts(
        session,
        query,
        now=utcnow(),
        incident_url=config.incident_url,
        runbook_url=config.runbook_url,
    )


@router.get("/alerts", summary="Open incidents as Alertmanager alerts", response_model=None)
def list_alerts(
    session: SessionDep,
    config: AlertsConfigDep,
    _viewer: ViewerUser,
    filter: Annotated[list[str] | None, Query()] = None,  # noqa: A002 - the API's name
    active: bool = True,
    silenced: bool = True,
    inhibited: bool = True,
) -> list[dict[str, Any]] | JSONResponse:
    try:
        return _alerts(session, config, filter, active, silenced, inhibited)
    except ServiceError as err:
        return _am_error(err)


@router.get("/alerts/groups", summary="Open incidents as alert groups", response_model=None)
def list_alert_groups(
    session: SessionDep,
    config: AlertsConfigDep,
    _viewer: ViewerUser,
    filter: Annotated[list[str] | None, Query()] = None,  # noqa: A002 - the API's name
    active: bool = True,
    silenced: bool = True,
    inhibited: bool = True,
) -> list[dict[str, Any]] | JSONResponse:
    try:
        return am.alert_groups(_alerts(session, config, filter, active, silenced, inhibited))
    except ServiceError as err:
        return _am_error(err)


@router.get("/receivers", summary="The one receiver (RLGuard's own alert channels)")
def list_receivers(_viewer: ViewerUser) -> list[dict[str, str]]:
    return [{"name": am.RECEIVER}]
