"""Guard-rail state is rows in PostgreSQL, so it holds across a server's ``kill -9`` and across
replicas: on the real stack (server processes with the policy tick, a real Celery worker,
PostgreSQL + Redis, the fake launcher), a breaker tripped through replica A blocks a restart
judged by replica B once A is killed -9; A, restarted on the same database, still blocks; and
after an approver's reset a participant whose restart budget was spent before both kills is
escalated to an approver again, not restarted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import RedisServer
from tests.harness.processes import RLGUARD, ServerProcess
from tests.harness.services import free_port
from tests.harness.stack import JOB, Stack, fast_policy
from tests.integration.guardrails.test_breaker_storm_worker import (
    add_nodes,
    events,
    incident_on,
    restart_and_recover,
    restart_calls,
    restarts_done,
)
from tests.integration.policy.test_policy_scenarios import _base_cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]

NODES = ("n0", "n1", "n2", "n3")
RANKS = [(node, JOB, "rollout", 10 if node == "n0" else i) for i, node in enumerate(NODES)]
POLICY = {
    # One automatic restart per rank in 30 min; the job's breaker opens at a second node.
    "guardrails.budgets": {
        "restart_role": {
            "per_rank": 1,
            "per_role": 10,
            "window_seconds": 1800,
            "backoff_seconds": 0,
        }
    },
    "guardrails.job_breaker": {"max_actions": 20, "max_nodes": 1, "window_seconds": 600},
}


@pytest.fixture
def rails_stack(tmp_path: Path, postgres_url: str, own_redis: RedisServer) -> Iterator[Stack]:
    policy = fast_policy(tmp_path / "policy.yaml", **POLICY)
    s = Stack(tmp_path, database_url=postgres_url, redis=own_redis, policy=policy)
    # Replicas share the series window through Redis (as deployed), and a dead lease holder's
    # scheduler lease passes to the other within seconds.
    s.env.update(
        RLGUARD_SERIES__SHARED_WINDOW="true",
        RLGUARD_SERIES__SHARED_FOLLOW_INTERVAL_SECONDS="0.2",
        RLGUARD_RECOVERY_LEASE_SECONDS="3",
    )
    try:
        yield s
    finally:
        s.close()


def blocked_on(stack: Stack, node: str) -> dict[str, Any] | None:
    inc = incident_on(stack, node)
    return inc if inc is not None and events(inc, "action_not_run") else None


@pytest.mark.timeout(360)
def test_breaker_and_budget_hold_across_kill_9_and_replicas(rails_stack: Stack) -> None:
    stack = rails_stack
    add_nodes(stack, *NODES)
    a = stack.server_process
    b = ServerProcess(
        [*RLGUARD, "server", "--host", "127.0.0.1", "--port", str(port_b := free_port())],
        stack.env,
        port_b,
        stack.tmp / "server-b.log",
        ready_path="/healthz",
    )
    try:
        _run(stack, a, b)
    finally:
        b.kill9()


def _run(stack: Stack, a: ServerProcess, b: ServerProcess) -> None:
    stack.start_server()  # replica A, alone: it runs the policy tick
    stack.start_worker(*[x for node in NODES for x in ("--node", node)], "--cluster")
    _base_cluster(stack)
    for node, job, role, rank in RANKS:
        stack.feeder.participant(node, role, rank, job=job, phase="ROLLOUT")
    stack.feeder.start()
    stack.wait_baselines()
    restart_and_recover(stack, RANKS[0], 1)  # spends rank 10's budget (one per 30 min)

    # A second node: the job's breaker trips, through A (the only server running).
    stack.feeder.freeze_heartbeat(*RANKS[1])

    def tripped() -> dict[str, Any] | None:
        inc = incident_on(stack, "n1")
        return inc if inc is not None and events(inc, "breaker_tripped") else None

    inc = stack.wait(tripped, 60, "the second node to trip the job's breaker")
    assert inc["tier"] == "heavy"

    # Replica B joins on the same PostgreSQL + Redis; A is killed -9; B alone judges now.
    b.start(timeout=60)
    [brk] = [x for x in _get(b, "/api/v1/breakers", stack.viewer) if x["scope"] == f"job:{JOB}"]
    assert brk["open"] is True and brk["incident_id"] == inc["id"]
    a.kill9()
    stack.point_at(b.url)
    stack.feeder.freeze_heartbeat(*RANKS[2])
    inc2 = stack.wait(lambda: blocked_on(stack, "n2"), 60, "B to block the third node's restart")
    [why] = events(inc2, "action_not_run")
    assert why["detail"]["reason"].startswith(f"not run: circuit breaker job:{JOB} open since")
    assert inc2["actions"] == []

    # A comes back on the same database (B is killed -9 in turn): the breaker still blocks.
    a.start(timeout=60)
    b.kill9()
    stack.point_at(a.url)
    stack.feeder.freeze_heartbeat(*RANKS[3])
    inc3 = stack.wait(lambda: blocked_on(stack, "n3"), 60, "restarted A to block the fourth node")
    assert inc3["actions"] == []
    assert restarts_done(stack) == 1 and restart_calls(stack) == 2

    # An approver resets the breaker on the restarted A. Rank 10 fails again: its budget, spent
    # before both kills, still sends the restart to an approver instead of the launcher.
    r = stack.post(f"/api/v1/breakers/job:{JOB}/reset", json={"comment": "checked"})
    assert r.status_code == 200 and r.json()["open"] is False, r.text
    stack.feeder.freeze_heartbeat(*RANKS[0])

    def escalated() -> dict[str, Any] | None:
        i = incident_on(stack, "n0")
        return i if i is not None and events(i, "guardrail_escalated") else None

    inc0 = stack.wait(escalated, 60, "the spent budget to escalate after the restarts")
    assert inc0["tier"] == "heavy"
    assert [e["detail"]["reason"] for e in events(inc0, "guardrail_escalated")] == [
        "not run: restart budget of rollout/10 spent, 1 in 30 min"
    ]
    [restart] = [x for x in inc0["actions"] if x["action"] == "restart_role"]
    assert restart["status"] == "pending_approval"
    assert restarts_done(stack) == 1 and restart_calls(stack) == 2


def _get(server: ServerProcess, path: str, token: str) -> Any:
    import httpx

    r = httpx.get(server.url + path, headers=Stack.auth(token), timeout=10)
    assert r.status_code == 200, (path, r.status_code, r.text)
    return r.json()
