"""REST: GET /api/v1/alerts, GET /api/v1/alerts/channels, POST /api/v1/alerts/test (admin)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlmodel import Session, select

from app.alerts import queue
from app.core import migrate
from app.main import create_app
from app.models import AuditEvent, Role
from tests.harness import Api, AppClient, auth, make_settings
from tests.unit.app.alerts._factories import (
    SLACK_SECRET_PATH,
    T0,
    WEBHOOK_SIGNING,
    WECOM_KEY,
    config,
    event,
)
from tests.unit.app.alerts._recording_server import RecordingServer, wecom

pytestmark = pytest.mark.integration
SECRETS = ("slacksecrettoken123", "T0SECRET1", WECOM_KEY, WEBHOOK_SIGNING, SLACK_SECRET_PATH)


@pytest.fixture
def api(database_url: str, tmp_path: Path, server: RecordingServer) -> Iterator[Api]:
    migrate.upgrade(database_url)
    app = create_app(make_settings(database_url, tmp_path / "data"))
    app.state.alerts_config = config(server.url(""))
    client = AppClient(app)
    try:
        yield Api(client)
    finally:
        client.close()


def assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text


def test_list_deliveries_and_their_filters(api: Api) -> None:
    viewer = auth(api.user_token("vera", Role.viewer))
    with Session(api.engine) as session:
        queue.queue_events(
            session,
            events=[event(event_id="a"), event(event_id="b", incident_id=43)],
            config=api.app.state.alerts_config,
            now=T0,
        )
        session.commit()
    answer = api.client.get("/api/v1/alerts", headers=viewer)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert len(body["deliveries"]) == 6 and body["next_before_id"] is None
    first = body["deliveries"][0]
    assert first["state"] == "pending" and first["incident_id"] == 43 and first["attempt_log"] == []
    page = api.client.get("/api/v1/alerts", params={"limit": 4}, headers=viewer).json()
    assert len(page["deliveries"]) == 4 and page["next_before_id"] == page["deliveries"][-1]["id"]
    rest = api.client.get(
        "/api/v1/alerts", params={"before_id": page["next_before_id"]}, headers=viewer
    ).json()
    assert len(rest["deliveries"]) == 2
    only = api.client.get(
        "/api/v1/alerts", params={"incident_id": 42, "channel": "pager"}, headers=viewer
    ).json()
    assert [(d["incident_id"], d["channel"]) for d in only["deliveries"]] == [(42, "pager")]
    assert_no_secret(answer.text)


@pytest.mark.parametrize(
    ("params", "status", "message"),
    [
        ({"state": "lost"}, 422, "state='lost' is not one of"),
        ({"limit": 0}, 422, "limit"),
        ({"incident_id": "x"}, 422, "incident_id"),
    ],
)
def test_bad_list_queries_are_refused(
    api: Api, params: dict[str, object], status: int, message: str
) -> None:
    viewer = auth(api.user_token("vera", Role.viewer))
    answer = api.client.get("/api/v1/alerts", params=params, headers=viewer)
    assert answer.status_code == status and message in answer.text


def test_listing_needs_a_user(api: Api) -> None:
    assert api.client.get("/api/v1/alerts").status_code == 401
    assert api.client.get("/api/v1/alerts/channels").status_code == 401


def test_channels_are_shown_masked(api: Api, server: RecordingServer) -> None:
    viewer = auth(api.user_token("vera", Role.viewer))
    answer = api.client.get("/api/v1/alerts/channels", headers=viewer)
    assert answer.status_code == 200
    channels = answer.json()["channels"]
    assert [c["name"] for c in channels] == ["ops-slack", "ops-wecom", "pager"]
    assert {c["url"] for c in channels} == {f"http://127.0.0.1:{server.port}/***"}
    assert_no_secret(answer.text)


@pytest.mark.timeout(60)
def test_admin_sends_a_test_message(api: Api, server: RecordingServer) -> None:
    admin = auth(api.user_token("ada", Role.admin))
    server.default = wecom(0)
    answer = api.client.post("/api/v1/alerts/test", params={"channel": "ops-wecom"}, headers=admin)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "channel": "ops-wecom",
        "channel_type": "wecom",
        "status": "sent",
        "attempts": 1,
        "response_code": 200,
        "last_error": None,
    }
    (request,) = server.requests
    assert "配置正确" in request.body.decode()  # the channel's own locale (zh)
    with Session(api.engine) as session:
        audit = session.exec(select(AuditEvent).where(AuditEvent.action == "alerts.test")).one()
    assert audit.actor == "user:ada" and audit.target == "channel:ops-wecom"


@pytest.mark.timeout(60)
def test_a_failing_test_message_reports_why_without_secrets(
    api: Api, server: RecordingServer
) -> None:
    admin = auth(api.user_token("ada", Role.admin))
    server.reply(wecom(93000, f"invalid webhook url key={WECOM_KEY}"))
    answer = api.client.post("/api/v1/alerts/test", params={"channel": "ops-wecom"}, headers=admin)
    assert answer.status_code == 200
    assert (
        answer.json()["status"] == "rejected"
        and "WeCom errcode 93000" in answer.json()["last_error"]
    )
    assert_no_secret(answer.text)


def test_test_message_bad_input_and_roles(api: Api, server: RecordingServer) -> None:
    admin = auth(api.user_token("ada", Role.admin))
    approver = auth(api.user_token("abe", Role.approver))
    assert (
        api.client.post(
            "/api/v1/alerts/test", params={"channel": "ops-slack"}, headers=approver
        ).status_code
        == 403
    )
    missing = api.client.post("/api/v1/alerts/test", params={"channel": "nope"}, headers=admin)
    assert missing.status_code == 404 and "no alert channel named 'nope'" in missing.text
    assert api.client.post("/api/v1/alerts/test", headers=admin).status_code == 422
    assert (
        api.client.post("/api/v1/alerts/test", params={"channel": ""}, headers=admin).status_code
        == 422
    )
    assert server.requests == []


@pytest.mark.timeout(60)
def test_a_muted_channel_still_takes_a_test_message(api: Api, server: RecordingServer) -> None:
    cfg = api.app.state.alerts_config
    muted = cfg.channels[0].model_copy(update={"muted": True})
    api.app.state.alerts_config = cfg.model_copy(update={"channels": (muted, *cfg.channels[1:])})
    admin = auth(api.user_token("ada", Role.admin))
    answer = api.client.post("/api/v1/alerts/test", params={"channel": "ops-slack"}, headers=admin)
    assert answer.status_code == 200 and answer.json()["status"] == "sent"
    assert [r.path for r in server.requests] == [SLACK_SECRET_PATH]
