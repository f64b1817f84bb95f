"""Alert deliveries (viewer) and a test message per channel (admin). No URL is ever shown raw."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from app.alerts import service as alert_service
from app.alerts.config import CONTACTS_READER_ROLE, AlertsConfig
from app.alerts.delivery import RetryPolicy
from app.alerts.errors import AlertConfigError, AlertEventError
from app.alerts.public import (
    AlertChannelsPublic,
    AlertDeliveriesPublic,
    AlertDeliveryPublic,
    TestMessageResult,
)
from app.api.deps import AdminUser, RowId, SessionDep, ViewerUser
from app.auth.audit import record_audit
from app.core.errors import InvalidInput, NotFound
from app.models import Role
from app.models._types import utcnow
from app.models.alert import AlertDelivery

router = APIRouter(prefix="/api/v1/alerts", tags=["alerts"])

# An admin waits on this request: a couple of quick tries, never minutes.
TEST_POLICY = RetryPolicy(
    max_attempts=2, base_delay_s=0.5, max_retry_after_s=5.0, deadline_s=15.0, read_timeout_s=5.0
)


def get_alerts_config(request: Request) -> AlertsConfig:
    configured: AlertsConfig | None = getattr(request.app.state, "alerts_config", None)
    return configured if configured is not None else alert_service.current_config()


AlertsConfigDep = Annotated[AlertsConfig, Depends(get_alerts_config)]


def _public(row: AlertDelivery) -> AlertDeliveryPublic:
    return AlertDeliveryPublic.model_validate(row, from_attributes=True)


@router.get("", response_model=AlertDeliveriesPublic, summary="Alert deliveries, newest first")
def list_alerts(
    session: SessionDep,
    _viewer: ViewerUser,
    incident_id: RowId | None = None,
    channel: str | None = None,
    state: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    before_id: RowId | None = None,
) -> AlertDeliveriesPublic:
    try:
        rows = alert_service.list_deliveries(
            session,
            incident_id=incident_id,
            channel=channel,
            state=state,
            limit=limit,
            before_id=before_id,
        )
    except AlertEventError as exc:
        raise InvalidInput(str(exc)) from None
    more = len(rows) == limit and rows
    return AlertDeliveriesPublic(
        deliveries=[_public(r) for r in rows], next_before_id=rows[-1].id if more else None
    )


@router.get(
    "/channels", response_model=AlertChannelsPublic, summary="Configured channels (URLs masked)"
)
def list_channels(config: AlertsConfigDep, viewer: ViewerUser) -> AlertChannelsPublic:
    # Phone numbers only for admins; other roles see them masked.
    reveal = Role(viewer.role).allows(CONTACTS_READER_ROLE)
    return AlertChannelsPublic(
        channels=[c.public(reveal_contacts=reveal) for c in config.channels],
        group_wait_s=config.group_wait_s,
        repeat_interval_s=config.repeat_interval_s,
        external_base_url=config.external_base_url,
    )


@router.post(
    "/test", response_model=TestMessageResult, summary="Send a test message to one channel"
)
def send_test(
    session: SessionDep,
    config: AlertsConfigDep,
    admin: AdminUser,
    channel: Annotated[str, Query(min_length=1, max_length=64)],
) -> TestMessageResult:
    try:
        target = config.channel(channel)
    except AlertConfigError as exc:
        raise NotFound(str(exc)) from None
    record = alert_service.send_test_message(
        config=config, channel=target.name, now=utcnow(), policy=TEST_POLICY
    )
    record_audit(
        session,
        actor=f"user:{admin.name}",
        action="alerts.test",
        target=f"channel:{target.name}",
        detail={"status": record.status.value, "response_code": record.response_code},
    )
    session.commit()
    return TestMessageResult(
        channel=target.name,
        channel_type=target.type,
        status=record.status.value,
        attempts=record.attempts,
        response_code=record.response_code,
        last_error=record.last_error,
    )
