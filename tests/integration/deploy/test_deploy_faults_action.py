"""PostgreSQL crashes while a recovery action runs: the action completes exactly once, its result
is recorded once the database is back, and neither the server nor the worker is restarted.

The stack is the policy tests' (real server with the policy scheduler, real Celery worker, a
launcher that logs every call), on a PostgreSQL and a Redis of this test's own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import RedisServer
from tests.harness.services import PostgresInstance
from tests.harness.stack import JOB, Stack, fast_policy
from tests.integration.policy.test_policy_scenarios import _action, _base_cluster, _succeeded

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture
def pg_stack(tmp_path: Path) -> Iterator[tuple[Stack, PostgresInstance]]:
    pg = PostgresInstance(tmp_path / "pg").init()
    redis = RedisServer(tmp_path)
    redis.start()
    stack = Stack(
        tmp_path, database_url=pg.url, redis=redis, policy=fast_policy(tmp_path / "policy.yaml")
    )
    try:
        yield stack, pg
    finally:
        stack.close()
        redis.stop()
        pg.destroy()


def test_postgres_crash_during_an_action_it_completes_once(
    pg_stack: tuple[Stack, PostgresInstance],
) -> None:
    stack, pg = pg_stack
    stack.env["RLGUARD_TEST_LAUNCHER_SLEEP"] = "restart_role=6"
    # The case under test is an outage shorter than the action's lease. With the policy stack's
    # 10 s lease, a PostgreSQL restart that took a few seconds on a loaded machine let the lease
    # run out while the worker waited to record its result, and the action was rightly claimed a
    # second time (attempts 2): that is the lease-expiry case, which other tests cover.
    stack.env["RLGUARD_RECOVERY_ACTION_LEASE_SECONDS"] = "60"
    stack.start_server()
    worker = stack.start_worker("--node", "n0", "--node", "n1", "--cluster")
    _base_cluster(stack)
    stack.feeder.start()
    stack.wait_baselines()
    stack.feeder.freeze_heartbeat("n0", JOB, "trainer", 1)
    stack.wait(
        lambda: any(
            c["event"] == "start" and c["action"] == "restart_role" for c in stack.launcher_calls()
        ),
        60,
        "the restart to begin",
    )
    pg.stop_immediate()  # the worker is inside the launcher; the server's tick loses its DB
    time.sleep(4)  # the scenario: a database outage that lasts past a few policy ticks
    pg.start()
    done = stack.wait(
        lambda: _succeeded(stack, "heartbeat_lost", "restart_role"),
        90,
        "the restart to be recorded as succeeded",
    )
    action = _action(done, "restart_role")
    assert action is not None and action["attempts"] == 1
    # This action's calls only: once the database is back, the fault (the heartbeat stays frozen)
    # may recur as a new incident whose own restart can run before this result is recorded.
    key = action["idempotency_key"]
    calls = [c for c in stack.launcher_calls() if c["opts"].get("--idempotency-key") == key]
    assert [c["event"] for c in calls] == ["start", "done"]  # ran once, was not re-run
    assert len([e for e in done["timeline"] if e["type"] == "action_succeeded"]) == 1
    assert stack.server is not None and stack.server.poll() is None
    assert worker.poll() is None
    assert "OperationalError" in (stack.tmp / "server.log").read_text()  # the outage was real
