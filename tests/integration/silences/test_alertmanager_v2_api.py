"""Alertmanager's API v2 subset (``/api/v2``) on SQLite and PostgreSQL: the same silence rows
as ``/api/v1/silences``, Alertmanager's shapes, roles, audit, 400 text naming a bad matcher,
and open incidents as alerts with ``status.silencedBy``. amtool itself drives a real server in
``test_amtool.py``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlmodel import Session

from app.models import Role
from app.models._types import utcnow
from app.policy.signals import FaultKind, Subject
from tests.harness import Api, auth
from tests.integration.silences.test_muting import open_

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(120)]


def iso(minutes: float) -> str:
    return (utcnow() + timedelta(minutes=minutes)).isoformat().replace("+00:00", "Z")


def am_silence(*matchers: dict[str, Any], comment: str = "riser swap") -> dict[str, Any]:
    return {
        "matchers": list(matchers),
        "startsAt": iso(0),
        "endsAt": iso(60),
        "createdBy": "olga",
        "comment": comment,
    }


NODE_N1 = {"name": "node", "value": "n1", "isRegex": False, "isEqual": True}


def silences_in_db(api: Api) -> int:
    with Session(api.engine) as s:
        return int(s.execute(sa.text("SELECT count(*) FROM silence")).scalar_one())


def audit(api: Api) -> list[tuple[str, str, str]]:
    with Session(api.engine) as s:
        rows = s.execute(sa.text("SELECT action, actor, target FROM audit_event ORDER BY id"))
        return [(r[0], r[1], r[2]) for r in rows if r[0].startswith("silence")]


def test_one_store_for_both_apis_with_alertmanagers_shapes_and_audit(api: Api) -> None:
    op, viewer = api.user_token("olga", Role.operator), api.user_token("vic", Role.viewer)
    c = api.client
    regex_not = {"name": "alertname", "value": "gpu_.*", "isRegex": True, "isEqual": False}
    made = c.post("/api/v2/silences", json=am_silence(NODE_N1, regex_not), headers=auth(op))
    assert made.status_code == 200, made.text
    uuid = made.json()["silenceID"]
    assert uuid.startswith("00000000-0000-4000-8000-")

    [listed] = c.get("/api/v2/silences", headers=auth(viewer)).json()
    assert listed["id"] == uuid and listed["status"] == {"state": "active"}
    assert listed["createdBy"] == "user:olga" and listed["comment"] == "riser swap"
    # alertname is RLGuard's kind: stored and shown as kind.
    assert listed["matchers"] == [
        NODE_N1,
        {"name": "kind", "value": "gpu_.*", "isRegex": True, "isEqual": False},
    ]
    [v1] = c.get("/api/v1/silences", headers=auth(viewer)).json()
    assert v1["matchers"] == [
        {"label": "node", "op": "=", "value": "n1"},
        {"label": "kind", "op": "!~", "value": "gpu_.*"},
    ]
    assert uuid.endswith(f"{v1['id']:012x}")
    # By its UUID and by RLGuard's plain id (the one the Silences page shows).
    assert c.get(f"/api/v2/silence/{uuid}", headers=auth(viewer)).json() == listed
    assert c.get(f"/api/v2/silence/{v1['id']}", headers=auth(viewer)).json()["id"] == uuid
    filtered = c.get("/api/v2/silences", params={"filter": 'node="n2"'}, headers=auth(viewer))
    assert filtered.status_code == 200 and filtered.json() == []
    filtered = c.get("/api/v2/silences", params={"filter": "node=n1"}, headers=auth(viewer))
    assert [s["id"] for s in filtered.json()] == [uuid]

    assert c.delete(f"/api/v2/silence/{uuid}", headers=auth(viewer)).status_code == 403
    gone = c.delete(f"/api/v2/silence/{uuid}", headers=auth(op))
    assert gone.status_code == 200, gone.text
    assert c.get(f"/api/v2/silence/{uuid}", headers=auth(viewer)).json()["status"] == {
        "state": "expired"
    }
    again = c.delete(f"/api/v2/silence/{uuid}", headers=auth(op))
    assert again.status_code == 409 and "already expired" in again.json()
    for bad_id in ("²", "x1", "-1", "00000000-0000-0000-0000-000000000001"):
        r = c.get(f"/api/v2/silence/{bad_id}", headers=auth(op))
        assert r.status_code in (400, 404) and bad_id in r.json(), (bad_id, r.text)
    missing = c.get("/api/v2/silence/00000000-0000-4000-8000-0000000003e7", headers=auth(op))
    assert missing.status_code == 404 and "not found" in missing.json()
    target = f"silence:{v1['id']}"
    assert audit(api) == [
        ("silence.create", "user:olga", target),
        ("silence.expire", "user:olga", target),
    ]


def test_an_update_expires_the_old_silence_and_starts_a_new_one(api: Api) -> None:
    op = api.user_token("olga", Role.operator)
    c = api.client
    first = c.post("/api/v2/silences", json=am_silence(NODE_N1), headers=auth(op)).json()
    body = {**am_silence(NODE_N1, comment="longer"), "id": first["silenceID"], "endsAt": iso(90)}
    second = c.post("/api/v2/silences", json=body, headers=auth(op))
    assert second.status_code == 200, second.text
    states = {
        s["id"]: s["status"]["state"] for s in c.get("/api/v2/silences", headers=auth(op)).json()
    }
    assert states == {first["silenceID"]: "expired", second.json()["silenceID"]: "active"}
    unknown = {**body, "id": "00000000-0000-4000-8000-0000000003e7"}
    assert c.post("/api/v2/silences", json=unknown, headers=auth(op)).status_code == 404


BAD: list[tuple[dict[str, Any], str]] = [
    ({"name": "gpu_model", "value": "H100", "isRegex": False}, "unknown label 'gpu_model'"),
    ({"name": "job", "value": "(grpo", "isRegex": True}, "bad regex"),
    ({"name": "job", "value": ".*", "isRegex": True}, "match an empty"),
]


def test_a_malformed_body_is_refused_naming_the_field(api: Api) -> None:
    op = api.user_token("olga", Role.operator)
    for body, reason in (
        ({k: v for k, v in am_silence(NODE_N1).items() if k != "endsAt"}, "endsAt: Field required"),
        ({**am_silence(NODE_N1), "matchers": []}, "silence invalid: matchers:"),
        ({**am_silence(NODE_N1), "startsAt": "soon"}, "silence invalid: startsAt:"),
        ([1, 2], "silence invalid: body:"),
    ):
        r = api.client.post("/api/v2/silences", json=body, headers=auth(op))
        assert r.status_code == 400 and reason in r.json(), (body, r.text)
    assert silences_in_db(api) == 0


def test_a_time_without_a_zone_is_refused_naming_it(api: Api) -> None:
    op = api.user_token("olga", Role.operator)
    body = {**am_silence(NODE_N1), "startsAt": "2030-01-01T10:00:00", "endsAt": iso(60)}
    r = api.client.post("/api/v2/silences", json=body, headers=auth(op))
    assert r.status_code == 400 and "starts_at=2030-01-01T10:00:00 has no time zone" in r.json()
    assert silences_in_db(api) == 0


@pytest.mark.parametrize(("matcher", "reason"), BAD, ids=["label", "regex", "empty"])
def test_a_bad_matcher_is_refused_with_alertmanagers_400_text_and_nothing_changes(
    api: Api, matcher: dict[str, Any], reason: str
) -> None:
    op = api.user_token("olga", Role.operator)
    r = api.client.post("/api/v2/silences", json=am_silence(matcher), headers=auth(op))
    assert r.status_code == 400, r.text
    text = r.json()
    assert isinstance(text, str) and text.startswith("silence invalid") and reason in text
    assert silences_in_db(api) == 0 and audit(api) == []


def test_roles_and_tokens(api: Api) -> None:
    viewer = api.user_token("vic", Role.viewer)
    c = api.client
    refused = c.post("/api/v2/silences", json=am_silence(NODE_N1), headers=auth(viewer))
    assert refused.status_code == 403 and "operator" in refused.text
    assert c.get("/api/v2/silences").status_code == 401
    assert c.get("/api/v2/silences", headers=auth("not-a-token")).status_code == 401
    status = c.get("/api/v2/status", headers=auth(viewer))
    assert status.status_code == 200 and status.json()["cluster"]["status"] == "disabled"
    assert set(status.json()["versionInfo"]) == {
        "version", "revision", "branch", "buildUser", "buildDate", "goVersion",
    }  # fmt: skip
    assert silences_in_db(api) == 0


def test_open_incidents_are_alerts_with_silenced_by(api: Api) -> None:
    op, viewer = api.user_token("olga", Role.operator), api.user_token("vic", Role.viewer)
    c = api.client
    now = utcnow()
    lost = FaultKind.HEARTBEAT_LOST
    on_n1 = open_(api.engine, lost, Subject(node="n1", job="j", role="rollout", rank=0), now)
    on_n0 = open_(api.engine, lost, Subject(node="n0", job="j", role="trainer", rank=1), now)
    made = c.post("/api/v2/silences", json=am_silence(NODE_N1), headers=auth(op)).json()

    alerts = c.get("/api/v2/alerts", headers=auth(viewer)).json()
    by_node = {a["labels"]["node"]: a for a in alerts}
    assert set(by_node) == {"n0", "n1"}
    n1, n0 = by_node["n1"], by_node["n0"]
    assert n1["labels"] == {
        "alertname": "heartbeat_lost", "job": "j", "node": "n1", "role": "rollout",
        "rank": "0", "kind": "heartbeat_lost", "tier": "medium",
    }  # fmt: skip
    assert n1["status"] == {
        "state": "suppressed", "silencedBy": [made["silenceID"]], "inhibitedBy": []
    }  # fmt: skip
    assert n0["status"] == {"state": "active", "silencedBy": [], "inhibitedBy": []}
    assert n1["generatorURL"].endswith(f"/incidents/{on_n1}")
    assert n0["annotations"]["runbook_url"].endswith("/runbooks/heartbeat_lost")
    assert {"receivers", "fingerprint", "startsAt", "updatedAt", "endsAt"} <= set(n1)
    assert n0["fingerprint"] != n1["fingerprint"]

    def nodes(**params: Any) -> list[str]:
        r = c.get("/api/v2/alerts", params=params, headers=auth(viewer))
        assert r.status_code == 200, r.text
        return sorted(a["labels"]["node"] for a in r.json())

    assert nodes(silenced="false") == ["n0"]
    assert nodes(active="false") == ["n1"]
    assert nodes(filter='node="n0"') == ["n0"]
    assert nodes(filter=["alertname=~heart.*", "role!=trainer"]) == ["n1"]
    assert on_n0 != on_n1
    [group] = c.get("/api/v2/alerts/groups", headers=auth(viewer)).json()
    assert group["labels"] == {"job": "j"} and group["receiver"] == {"name": "rlguard"}
    assert sorted(a["labels"]["node"] for a in group["alerts"]) == ["n0", "n1"]
    quiet = c.get("/api/v2/alerts/groups", params={"silenced": "false"}, headers=auth(viewer))
    assert [a["labels"]["node"] for a in quiet.json()[0]["alerts"]] == ["n0"]
    assert c.get("/api/v2/receivers", headers=auth(viewer)).json() == [{"name": "rlguard"}]
    bad = c.get("/api/v2/alerts", params={"filter": 'gpu_model="H100"'}, headers=auth(viewer))
    assert bad.status_code == 400 and "unknown label 'gpu_model'" in bad.json()
