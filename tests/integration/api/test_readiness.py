"""``/readyz`` in cluster mode checks the broker (Redis) too (issue 41 item 6): an orchestrator
sees a replica whose outbox cannot hand anything to Celery. A Redis of the test's own is
stopped and started again (never the machine's on 6379)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.harness import Api, RedisServer, refusing_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_readyz_names_the_broker_while_redis_is_down_and_recovers(
    migrated_url: str, make_api: Callable[..., Api], own_redis: RedisServer
) -> None:
    api = make_api(migrated_url, redis_url=own_redis.url)
    r = api.client.get("/readyz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "database": "ok", "broker": "ok", "ingest": "ok"}

    own_redis.stop()
    r = api.client.get("/readyz")
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "unavailable" and body["database"] == "ok"
    assert body["broker"].startswith("Redis unreachable (") and "ConnectionError" in body["broker"]

    own_redis.start()  # same port, a fresh server: the kept client reconnects by itself
    r = api.client.get("/readyz")
    assert r.status_code == 200 and r.json()["broker"] == "ok"


def test_readyz_is_503_when_the_broker_was_never_reachable(
    migrated_url: str, make_api: Callable[..., Api]
) -> None:
    with refusing_port() as port:
        api = make_api(migrated_url, redis_url=f"redis://127.0.0.1:{port}/0")
        r = api.client.get("/readyz")
    assert r.status_code == 503 and r.json()["broker"].startswith("Redis unreachable")


def test_embedded_mode_has_no_broker_to_check(api: Api) -> None:
    r = api.client.get("/readyz")
    assert r.status_code == 200 and "broker" not in r.json()
