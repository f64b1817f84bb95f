"""The silences and maintenance-window REST API on SQLite and PostgreSQL: roles, validation
(422 naming the reason, nothing stored), expiry, audit."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlmodel import Session

from app.models import Role
from app.models._types import utcnow
from tests.harness import Api, auth

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(120)]


def count(api: Api, table: str) -> int:
    with Session(api.engine) as s:
        return int(s.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())


def audit(api: Api) -> list[tuple[str, str, str]]:
    with Session(api.engine) as s:
        rows = s.execute(sa.text("SELECT action, actor, target FROM audit_event ORDER BY id"))
        return [(r[0], r[1], r[2]) for r in rows if r[0].startswith(("silence", "maint"))]


def iso(delta_minutes: float) -> str:
    return (utcnow() + timedelta(minutes=delta_minutes)).isoformat()


GOOD = {
    "matchers": [
        {"label": "node", "value": "n1"},
        {"label": "kind", "op": "=~", "value": "gpu_.*"},
    ],
    "duration_minutes": 60,
    "comment": "swapping the riser",
}


def test_operator_silences_viewer_lists_and_everything_is_audited(api: Api) -> None:
    op, viewer = api.user_token("olga", Role.operator), api.user_token("vic", Role.viewer)
    c = api.client
    assert c.post("/api/v1/silences", json=GOOD, headers=auth(viewer)).status_code == 403
    made = c.post("/api/v1/silences", json={**GOOD, "stops_actions": True}, headers=auth(op))
    assert made.status_code == 201, made.text
    s = made.json()
    assert (s["state"], s["author"], s["stops_actions"], s["comment"]) == (
        "active", "user:olga", True, "swapping the riser",
    )  # fmt: skip
    assert s["matchers"][1] == {"label": "kind", "op": "=~", "value": "gpu_.*"}
    listed = c.get("/api/v1/silences", headers=auth(viewer))
    assert listed.status_code == 200 and [x["id"] for x in listed.json()] == [s["id"]]
    assert c.post(f"/api/v1/silences/{s['id']}/expire", headers=auth(viewer)).status_code == 403
    expired = c.post(f"/api/v1/silences/{s['id']}/expire", headers=auth(op))
    assert expired.status_code == 200 and expired.json()["state"] == "expired"
    assert expired.json()["expired_by"] == "user:olga"
    again = c.post(f"/api/v1/silences/{s['id']}/expire", headers=auth(op))
    assert again.status_code == 409 and "already expired" in again.json()["detail"]
    assert c.post("/api/v1/silences/999/expire", headers=auth(op)).status_code == 404
    assert [x["state"] for x in c.get("/api/v1/silences", headers=auth(viewer)).json()] == [
        "expired"
    ]
    assert c.get("/api/v1/silences?active=true", headers=auth(viewer)).json() == []
    target = f"silence:{s['id']}"
    assert audit(api) == [
        ("silence.create", "user:olga", target),
        ("silence.expire", "user:olga", target),
    ]


BAD_SILENCES: list[tuple[dict[str, Any], str]] = [
    ({**GOOD, "matchers": []}, "at least one matcher"),
    ({**GOOD, "matchers": [{"label": "job", "op": "=~", "value": ".*"}]}, "match an empty"),
    ({**GOOD, "duration_minutes": None, "starts_at": iso(60), "ends_at": iso(0)}, "is not after"),
    ({**GOOD, "matchers": [{"label": "job", "op": "=~", "value": "(grpo"}]}, "bad regex"),
    (
        {**GOOD, "matchers": [{"label": "job", "op": "=~", "value": "grpo-(?!b).*"}]},
        "uses a negative lookahead (?!...)",
    ),
    (
        {**GOOD, "matchers": [{"label": "job", "op": "!~", "value": "(grpo)-\\1"}]},
        "matcher job!~: bad regex: regex '(grpo)-\\\\1' uses a backreference \\1",
    ),
    ({**GOOD, "matchers": [{"label": "hostname", "value": "n1"}]}, "unknown label 'hostname'"),
    ({**GOOD, "duration_minutes": 15 * 24 * 60}, "longer than the maximum of 336 h"),
    ({**GOOD, "duration_minutes": 1e300}, "longer than the maximum"),
    ({**GOOD, "duration_minutes": None, "ends_at": "2026-12-31T10:00:00"}, "no time zone"),
    ({**GOOD, "ends_at": iso(30)}, "exactly one"),
    ({**GOOD, "duration_minutes": 0}, "must be above 0"),
    ({**GOOD, "duration_minutes": "NaN"}, "must be above 0"),
    ({**GOOD, "starts_at": "9999-12-31T23:30:00Z"}, "past the year 9999"),
    ({**GOOD, "matchers": [{"label": "job", "op": "=~", "value": "a{4294967296}"}]}, "bad regex"),
    ({**GOOD, "matchers": [{"label": "node", "value": f"n{i}"} for i in range(21)]}, "at most 20"),
]


@pytest.mark.parametrize(("body", "reason"), BAD_SILENCES)
def test_a_bad_silence_is_refused_with_its_reason_and_nothing_is_stored(
    api: Api, body: dict[str, Any], reason: str
) -> None:
    op = api.user_token("olga", Role.operator)
    r = api.client.post("/api/v1/silences", json=body, headers=auth(op))
    assert r.status_code == 422, r.text
    assert reason in r.json()["detail"]
    assert count(api, "silence") == 0 and audit(api) == []


def test_the_maximum_length_is_a_setting(migrated_url: str, make_api: Callable[..., Api]) -> None:
    api = make_api(migrated_url, silences={"max_duration_hours": 2})
    op = api.user_token("olga", Role.operator)
    r = api.client.post(
        "/api/v1/silences", json={**GOOD, "duration_minutes": 180}, headers=auth(op)
    )
    assert r.status_code == 422 and "maximum of 2 h" in r.json()["detail"]
    ok = api.client.post(
        "/api/v1/silences", json={**GOOD, "duration_minutes": 120}, headers=auth(op)
    )
    assert ok.status_code == 201, ok.text


def test_the_longest_regex_is_a_setting_named_in_the_refusal(
    migrated_url: str, make_api: Callable[..., Api]
) -> None:
    api = make_api(migrated_url, silences={"max_regex_chars": 8})
    op = api.user_token("olga", Role.operator)
    body = {**GOOD, "matchers": [{"label": "job", "op": "=~", "value": "grpo-a.*bc"}]}
    r = api.client.post("/api/v1/silences", json=body, headers=auth(op))
    assert r.status_code == 422, r.text
    assert "10 characters is over the limit of 8 (silences.max_regex_chars" in r.json()["detail"]
    assert count(api, "silence") == 0 and audit(api) == []
    body["matchers"][0]["value"] = "grpo-a.*"
    assert api.client.post("/api/v1/silences", json=body, headers=auth(op)).status_code == 201


def test_maintenance_windows_one_off_and_weekly(api: Api) -> None:
    op, viewer = api.user_token("olga", Role.operator), api.user_token("vic", Role.viewer)
    c = api.client
    once = {"node": "n1", "starts_at": iso(-5), "ends_at": iso(55), "comment": "BIOS update"}
    assert c.post("/api/v1/maintenance-windows", json=once, headers=auth(viewer)).status_code == 403
    r1 = c.post("/api/v1/maintenance-windows", json=once, headers=auth(op))
    assert r1.status_code == 201, r1.text
    assert (r1.json()["state"], r1.json()["recurrence"]) == ("open", "once")
    weekly = {
        "job": "grpo-a",
        "recurrence": "weekly",
        "weekday": 6,
        "start_time": "23:30",
        "duration_minutes": 90,
        "comment": "storage firmware",
    }
    r2 = c.post("/api/v1/maintenance-windows", json=weekly, headers=auth(op))
    assert r2.status_code == 201, r2.text
    assert (r2.json()["weekday"], r2.json()["start_minute"]) == (6, 23 * 60 + 30)
    listed = c.get("/api/v1/maintenance-windows", headers=auth(viewer)).json()
    assert [w["id"] for w in listed] == [r2.json()["id"], r1.json()["id"]]
    gone = c.post(f"/api/v1/maintenance-windows/{r1.json()['id']}/expire", headers=auth(op))
    assert gone.status_code == 200 and gone.json()["state"] == "expired"
    assert [a for a, _, _ in audit(api)] == [
        "maintenance_window.create", "maintenance_window.create", "maintenance_window.expire",
    ]  # fmt: skip


BAD_WINDOWS: list[tuple[dict[str, Any], str]] = [
    ({"starts_at": iso(0), "ends_at": iso(60)}, "names a node or a job"),
    ({"node": "n1", "starts_at": iso(60), "ends_at": iso(0)}, "is not after"),
    ({"node": "n1", "starts_at": iso(0), "ends_at": iso(15 * 24 * 60)}, "longer than the maximum"),
    ({"node": "n1", "starts_at": iso(0)}, "needs ends_at"),
    ({"node": "n1", "recurrence": "daily"}, "recurrence='daily'"),
    (
        {
            "node": "n1",
            "recurrence": "weekly",
            "weekday": 7,
            "start_time": "01:00",
            "duration_minutes": 60,
        },
        "weekday=7",
    ),
    (
        {
            "node": "n1",
            "recurrence": "weekly",
            "weekday": 1,
            "start_time": "25:00",
            "duration_minutes": 60,
        },
        "start_time='25:00'",
    ),
    (
        {"node": "n1", "recurrence": "weekly", "weekday": 1, "start_time": "01:00"},
        "duration_minutes=None",
    ),
]


@pytest.mark.parametrize(("body", "reason"), BAD_WINDOWS)
def test_a_bad_window_is_refused_with_its_reason_and_nothing_is_stored(
    api: Api, body: dict[str, Any], reason: str
) -> None:
    op = api.user_token("olga", Role.operator)
    r = api.client.post("/api/v1/maintenance-windows", json=body, headers=auth(op))
    assert r.status_code == 422, r.text
    assert reason in r.json()["detail"]
    assert count(api, "maintenance_window") == 0 and audit(api) == []
