"""Drills: operators inject a fault on purpose and read the report; viewers read.
The rules, the record and the report live in app.drills; this module parses and shapes."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from app.api.deps import OperatorUser, RowId, SessionDep, SettingsDep, ViewerUser
from app.core.errors import Unavailable
from app.drills import dispatch, service
from app.drills.public import DrillCreate, DrillPublic
from app.models import utcnow
from app.models.drill import DrillStatus
from app.tasks.celery_app import celery_app

router = APIRouter(prefix="/api/v1/drills", tags=["drills"])


@router.post(
    "",
    response_model=DrillPublic,
    status_code=201,
    summary="Inject a fault into a job's process (or, with plan, say what would happen)",
    responses={202: {"description": "sent; the node's launcher has not answered yet"}},
)
def create_drill(
    body: DrillCreate,
    request: Request,
    response: Response,
    session: SessionDep,
    settings: SettingsDep,
    operator: OperatorUser,
) -> DrillPublic:
    row = service.request_drill(
        session, body, actor=f"user:{operator.name}", now=utcnow(), settings=settings.drills
    )
    session.commit()
    assert row.id is not None
    try:
        dispatch.send_injection(celery_app, row.id, row.node)
    except Exception as exc:  # kombu/redis raise many types; all mean "not sent"
        service.mark_undeliverable(session, row.id, f"the task queue did not take it: {exc}")
        session.commit()
        raise Unavailable(
            f"drill {row.id} not sent: the task queue is unreachable; nothing injected"
        ) from exc
    row = service.wait_for_answer(
        request.app.state.engine, row.id, timeout=settings.drills.answer_wait_seconds
    )
    service.raise_if_refused(row)
    if row.status == DrillStatus.requested.value:
        response.status_code = 202
    return service.drill_public(row)


@router.get("", response_model=list[DrillPublic], summary="Drills, newest first")
def list_drills(
    session: SessionDep, _viewer: ViewerUser, job: str | None = None, plans: bool = False
) -> list[DrillPublic]:
    return [service.drill_public(r) for r in service.list_drills(session, job=job, plans=plans)]


@router.get("/{drill_id}", response_model=DrillPublic, summary="One drill and its report")
def get_drill(drill_id: RowId, session: SessionDep, _viewer: ViewerUser) -> DrillPublic:
    return service.drill_public(service.get_drill(session, drill_id))
