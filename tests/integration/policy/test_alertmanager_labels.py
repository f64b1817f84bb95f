"""Alertmanager labels on the real server (PostgreSQL + Redis and embedded SQLite): a label
that names a job, role, node or GPU obeys the ingest identifier rule. A batch with one bad
label is refused with 422 naming the label and its value, and nothing of it is applied: its
good alerts open no incident and no audit row is written."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from tests.harness.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]


def alert(fingerprint: str, **labels: str) -> dict[str, Any]:
    return {
        "status": "firing",
        "labels": {"alertname": "TrainerLossSpike", **labels},
        "annotations": {"summary": "loss spike"},
        "startsAt": "2026-11-29T10:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "fingerprint": fingerprint,
    }


def webhook(*alerts: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": "4",
        "status": "firing",
        "receiver": "rlguard",
        "groupKey": "{}:{}",
        "alerts": list(alerts),
    }


def audited(stack: Stack) -> int:
    with stack.engine.connect() as conn:
        query = "SELECT count(*) FROM audit_event WHERE action = 'alertmanager.webhook'"
        return int(conn.execute(sa.text(query)).scalar_one())


BAD_LABELS = [
    ("rl_job", "--run-root=/tmp/x"),
    ("rl_job", "-h"),
    ("rl_job", "jobC;id"),
    ("role", "-h"),
    ("node", "../n1"),
]


def test_a_bad_label_is_refused_by_name_and_nothing_of_the_batch_is_applied(stack: Stack) -> None:
    stack.start_server()
    good = alert("f-good", rl_job="grpo-good", role="trainer")
    for label, value in BAD_LABELS:
        bad = alert("f-bad", **{"rl_job": "grpo-bad", label: value})
        r = stack.post("/api/v1/alertmanager", json=webhook(good, bad))
        assert r.status_code == 422, r.text
        assert f"label {label}={value!r} cannot name a" in r.json()["detail"]
    assert audited(stack) == 0
    # A later valid batch opens its incident: a tick ran after the refused batches, which
    # opened nothing.
    after = stack.post("/api/v1/alertmanager", json=webhook(alert("f-after", rl_job="grpo-after")))
    assert after.status_code == 200 and after.json() == {"firing": 1, "resolved": 0}, after.text
    stack.wait(
        lambda: any(i["job"] == "grpo-after" for i in stack.incidents()), 60, "the later incident"
    )
    assert {i["job"] for i in stack.incidents()} == {"grpo-after"}
    assert audited(stack) == 1
