"""A stack (server with the policy tick, a real Celery worker, PostgreSQL, a Redis of its own)
whose one alert channel is a webhook to the local recording HTTP receiver; shared by the
inhibition tests."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlmodel import Session, select

from app.models.alert import AlertDelivery
from tests.harness import RedisServer
from tests.harness.stack import Stack, fast_policy
from tests.unit.app.alerts._factories import WEBHOOK_SIGNING
from tests.unit.app.alerts._recording_server import RecordingServer


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    r = RedisServer(tmp_path)
    r.start()
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture
def webhook_stack(
    tmp_path: Path, postgres_url: str, own_redis: RedisServer, server: RecordingServer
) -> Iterator[Callable[..., Stack]]:
    """Call it with policy overrides (``fast_policy``'s dotted keys) to get the stack."""
    made: list[Stack] = []

    def make(**overrides: Any) -> Stack:
        # No quiet period resolves anything while the test looks (a resolution is an alert too).
        policy = fast_policy(
            tmp_path / "policy.yaml", **{"incidents.quiet_period_seconds": 120, **overrides}
        )
        alerts = tmp_path / "alerts.yaml"
        alerts.write_text(
            yaml.safe_dump(
                {
                    "alerts": {
                        "external_base_url": "https://rlguard.example.com",
                        "group_wait_s": 1,
                        "claim_lease_s": 5,
                        "retry_base_delay_s": 1,
                        "channels": [
                            {
                                "type": "webhook",
                                "name": "pager",
                                "url": server.url("/hook"),
                                "signing_secret": WEBHOOK_SIGNING,
                            }
                        ],
                    }
                }
            )
        )
        s = Stack(tmp_path, database_url=postgres_url, redis=own_redis, policy=policy)
        s.env["RLGUARD_ALERTS_FILE"] = str(alerts)
        made.append(s)
        return s

    try:
        yield make
    finally:
        for s in made:
            s.close()


def hooks(server: RecordingServer) -> list[dict[str, Any]]:
    return [json.loads(r.body) for r in server.requests if r.path == "/hook"]


def deliveries(stack: Stack) -> list[AlertDelivery]:
    with Session(stack.engine) as s:
        return list(s.exec(select(AlertDelivery)).all())


def delivered(stack: Stack, server: RecordingServer) -> list[dict[str, Any]] | None:
    """The webhook bodies received, once every queued delivery is sent (or grouped)."""
    rows = deliveries(stack)
    done = rows and all(r.state in ("sent", "grouped") for r in rows)
    return hooks(server) if done and hooks(server) else None
