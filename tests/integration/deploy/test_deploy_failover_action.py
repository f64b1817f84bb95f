"""The lease-holding replica is kill -9ed while a recovery action runs: the other replica takes
the scheduler over within the lease time and the action is not run twice.

Two real servers (shared window), a real Celery worker, PostgreSQL and a Redis of this test's own;
the policy tests' stack plays the agents and logs every launcher call.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from tests.harness import RLGUARD, RedisServer, ServerProcess, free_port, kill_group
from tests.harness.stack import JOB, Feeder, Stack, fast_policy
from tests.integration.policy.test_policy_scenarios import _action, _base_cluster, _succeeded

LEASE_S = 3.0

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture
def two_replica_stack(postgres_url: str, tmp_path: Path) -> Iterator[Stack]:
    redis = RedisServer(tmp_path)
    redis.start()
    stack = Stack(
        tmp_path,
        database_url=postgres_url,
        redis=redis,
        policy=fast_policy(tmp_path / "policy.yaml"),
    )
    try:
        yield stack
    finally:
        stack.close()
        redis.stop()


def _lease_holder(stack: Stack) -> str | None:
    with stack.engine.connect() as c:
        row = c.execute(
            sa.text("SELECT holder FROM scheduler_lease WHERE expires_at > now()")
        ).first()
    return None if row is None else str(row[0])


def test_lease_holder_killed_mid_action_the_action_runs_once(two_replica_stack: Stack) -> None:
    stack = two_replica_stack
    stack.env.update(
        RLGUARD_SERIES__SHARED_WINDOW="true",
        RLGUARD_SERIES__SHARED_FOLLOW_INTERVAL_SECONDS="0.2",
        RLGUARD_RECOVERY_LEASE_SECONDS=str(LEASE_S),
        RLGUARD_TEST_LAUNCHER_SLEEP="restart_role=5",  # below the task soft limit (7.2 s)
    )
    stack.start_server()  # replica A
    first = stack.server
    assert first is not None
    stack.wait(lambda: _lease_holder(stack), 20, "replica A to take the scheduler lease")
    assert f":{first.pid}:" in (_lease_holder(stack) or "")
    port_b = free_port()
    replica_b = ServerProcess(
        [*RLGUARD, "server", "--host", "127.0.0.1", "--port", str(port_b)],
        stack.env,
        port_b,
        stack.tmp / "server-b.log",
    )
    try:
        second = replica_b.start().proc
        assert second is not None
        url_b = replica_b.url
        stack.start_worker("--node", "n0", "--node", "n1", "--cluster")
        _base_cluster(stack)
        stack.feeder.start()
        stack.wait_baselines()
        stack.feeder.freeze_heartbeat("n0", JOB, "trainer", 1)
        stack.wait(
            lambda: any(
                c["event"] == "start" and c["action"] == "restart_role"
                for c in stack.launcher_calls()
            ),
            60,
            "the restart to begin",
        )
        # The agents move to replica B (as behind a load balancer), then A dies mid-action.
        old = stack.feeder
        old.stop()
        stack.base_url = url_b
        stack.http.close()
        stack.http = httpx.Client(base_url=url_b, timeout=10)
        feeder = Feeder(stack)
        feeder.nodes, feeder._seq, feeder.silent = old.nodes, old._seq, old.silent  # noqa: SLF001
        stack.feeder = feeder
        feeder.start()
        assert not any(
            c["event"] == "done" and c["action"] == "restart_role" for c in stack.launcher_calls()
        )  # still running
        kill_group(first)
        killed_at = time.monotonic()
        stack.wait(
            lambda: f":{second.pid}:" in (_lease_holder(stack) or ""),
            LEASE_S + 5,
            "replica B to take the scheduler lease over",
        )
        failover = time.monotonic() - killed_at
        print(f"scheduler failover with an action in flight: {failover:.2f} s")  # noqa: T201
        assert failover <= LEASE_S + 2.0
        done = stack.wait(
            lambda: _succeeded(stack, "heartbeat_lost", "restart_role"),
            90,
            "the restart to be recorded as succeeded",
        )
        action = _action(done, "restart_role")
        assert action is not None and action["attempts"] == 1
        calls = [c for c in stack.launcher_calls() if c["action"] == "restart_role"]
        assert [c["event"] for c in calls] == ["start", "done"]  # once, never re-run
        assert second.poll() is None
    finally:
        replica_b.kill9()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
