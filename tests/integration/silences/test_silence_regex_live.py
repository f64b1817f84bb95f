"""Silence regexes on the real server (SQLite and PostgreSQL): RE2, so a nested quantifier
against a long job name neither stalls the policy tick nor the server; what RE2 cannot run is
refused with 422 naming the construct, and nothing is stored.

The job names come in through the Alertmanager webhook, which opens an incident per alert on
the next tick; the tick asks every active silence whether it mutes the incident. With Python's
backtracking engine ``(a+)+`` against ``a…a-x`` (64 a's) takes 2^64 steps while holding the
GIL: the incident would never be written and ``/healthz`` would not answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.stack import Stack, fast_policy

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(180)]

MATCHED = "a" * 64
UNMATCHED = "a" * 64 + "-x"


@pytest.fixture
def stack(database_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Stack]:
    redis = None if database_url.startswith("sqlite") else request.getfixturevalue("own_redis")
    policy = fast_policy(tmp_path / "policy.yaml", **{"incidents.quiet_period_seconds": 120})
    s = Stack(tmp_path, database_url=database_url, redis=redis, policy=policy)
    try:
        s.start_server()
        yield s
    finally:
        s.close()


def alert(job: str, fingerprint: str) -> dict[str, Any]:
    return {
        "status": "firing",
        "labels": {"alertname": "TrainerLossSpike", "rl_job": job},
        "annotations": {"summary": f"loss spike in {job[:8]}"},
        "startsAt": "2026-11-29T10:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "fingerprint": fingerprint,
    }


def silence(stack: Stack, op: str, value: str) -> Any:
    body = {
        "matchers": [{"label": "job", "op": op, "value": value}],
        "duration_minutes": 60,
        "comment": "regex",
    }
    return stack.post("/api/v1/silences", json=body)


def test_a_nested_quantifier_against_a_long_job_is_answered_and_mutes_only_its_match(
    stack: Stack,
) -> None:
    made = silence(stack, "=~", "(a+)+")
    assert made.status_code == 201, made.text
    payload = {
        "version": "4",
        "status": "firing",
        "receiver": "rlguard",
        "groupKey": "{}:{}",
        "alerts": [alert(UNMATCHED, "f-unmatched"), alert(MATCHED, "f-matched")],
    }
    r = stack.post("/api/v1/alertmanager", json=payload)
    assert r.status_code == 200 and r.json() == {"firing": 2, "resolved": 0}, r.text

    def both() -> dict[str, dict[str, Any]] | None:
        found = {i["job"]: i for i in stack.incidents() if i["job"] in (MATCHED, UNMATCHED)}
        return found if len(found) == 2 else None

    incidents = stack.wait(both, 60, "an incident for each alert (the tick checked the silence)")
    assert stack.http.get("/healthz").status_code == 200

    def timeline(job: str) -> list[str]:
        detail = stack.get(f"/api/v1/incidents/{incidents[job]['id']}", stack.viewer)
        return [e["type"] for e in detail["timeline"]]

    assert "silenced" in timeline(MATCHED)
    assert "silenced" not in timeline(UNMATCHED)


@pytest.mark.parametrize(
    ("op", "value", "named"),
    [
        ("=~", "grpo-(?=a).*", "uses a lookahead (?=...)"),
        ("!~", "(?<!x)grpo", "uses a negative lookbehind (?<!...)"),
        ("=~", "(grpo)-\\1", "uses a backreference \\1"),
    ],
)
def test_what_re2_cannot_run_is_refused_naming_it(
    stack: Stack, op: str, value: str, named: str
) -> None:
    r = silence(stack, op, value)
    assert r.status_code == 422 and named in r.json()["detail"], r.text
    assert stack.get("/api/v1/silences", stack.viewer) == []
