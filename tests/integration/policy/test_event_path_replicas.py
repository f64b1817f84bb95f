"""The event path across server replicas (shared window): a certain fault ingested by a replica
that does not hold the scheduler lease is acted on by the holder at once.

Two apps (ingest, shared series window, policy scheduler) on one PostgreSQL and a Redis of the
test's own, the policy tick every 60 s and the window followed every 10 s: the non-holder
announces the exit's commit group on the window's Redis channel, the holder's follower applies it
at once and nudges its scheduler. Without that wake-up the holder would see the exit at its next
follow and plan it at its next tick, a minute later.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
from sqlmodel import Session, select

from app.core import migrate
from app.main import create_app
from app.models.action import RecoveryAction
from app.models.incident import Incident
from app.series.backend import key_prefix
from tests.harness import Api, AppClient, RedisServer, auth, make_settings, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

WITHIN_SECONDS = 5.0  # far below both the follow interval (10 s) and the tick (60 s)


def _body(seq: int, phase: str) -> dict[str, object]:
    now = time.time()
    return {
        "agent_id": "agent-n0",
        "node": "n0",
        "seq": seq,
        "sent_at": now,
        "samples": [],
        "participants": [
            {"job": "j", "role": "trainer", "rank": 0, "phase": phase, "step": 20, "ts": now}
        ],
    }


def test_an_exit_ingested_by_another_replica_is_planned_by_the_holder_at_once(
    postgres_url: str, own_redis: RedisServer, tmp_path: Path
) -> None:
    migrate.upgrade(postgres_url)
    clients: list[AppClient] = []
    try:
        for i in range(2):
            settings = make_settings(
                postgres_url,
                tmp_path / f"data{i}",
                redis_url=own_redis.url,
                series={"shared_window": True, "shared_follow_interval_seconds": 10},
                policy={"tick_seconds": 60},
            )
            clients.append(AppClient(create_app(settings)))
        holder, other = (c.app.state.policy_scheduler for c in clients)
        assert holder.is_leader() and not other.is_leader()
        # Both followers listen on the window's channel (each subscribes once its scheduler
        # registered for certain faults).
        r = redis.Redis.from_url(own_redis.url)
        channel = f"{key_prefix(postgres_url)}:certain"
        wait_for(lambda: r.pubsub_numsub(channel)[0][1] >= 2, 20, "both followers subscribed")
        r.close()

        api = Api(clients[1])
        token = api.node_token("n0")
        assert (
            clients[1]
            .post("/api/v1/ingest", json=_body(1, "TRAIN"), headers=auth(token))
            .status_code
            == 200
        )
        resp = clients[1].post("/api/v1/ingest", json=_body(2, "EXITED"), headers=auth(token))
        assert resp.status_code == 200, resp.text
        acked = time.monotonic()

        def planned() -> list[RecoveryAction]:
            with Session(api.engine) as s:
                return list(s.exec(select(RecoveryAction)).all())

        actions = wait_for(planned, WITHIN_SECONDS, "the holder to plan the restart")
        assert time.monotonic() - acked < WITHIN_SECONDS
        assert [a.action for a in actions] == ["restart_role"]
        with Session(api.engine) as s:
            assert [i.kind for i in s.exec(select(Incident)).all()] == ["heartbeat_lost"]
        assert holder.event_ticks >= 1 and other.event_ticks == 0  # only the holder decides
    finally:
        for c in reversed(clients):
            c.close()
