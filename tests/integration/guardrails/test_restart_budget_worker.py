"""A flapping rollout rank on the real stack (server with the policy tick, a real Celery worker on
PostgreSQL + Redis, the fake launcher): restarted three times, then the restart budget sends the
fourth to an approver instead of the launcher."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness.stack import JOB, Stack
from tests.integration.policy.test_policy_scenarios import _base_cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

RANK = ("n1", JOB, "rollout", 1)


def restarts_done(stack: Stack) -> int:
    return sum(
        1 for c in stack.launcher_calls() if c["action"] == "restart_role" and c["event"] == "done"
    )


def open_heartbeat_incident(stack: Stack) -> dict[str, Any] | None:
    for inc in stack.incidents(status="open"):
        if inc["kind"] == "heartbeat_lost" and inc["job"] == JOB:
            return stack.get(f"/api/v1/incidents/{inc['id']}", stack.viewer)
    return None


@pytest.mark.timeout(240)
def test_a_flapping_rollout_is_restarted_three_times_then_escalated_to_heavy(
    redis_stack: Stack,
) -> None:
    stack = redis_stack
    stack.start_server()
    stack.start_worker("--node", "n0", "--node", "n1", "--cluster")
    _base_cluster(stack)
    stack.feeder.participant("n1", "rollout", 1, phase="ROLLOUT")
    stack.feeder.start()
    stack.wait_baselines()
    for n in (1, 2, 3):
        stack.feeder.freeze_heartbeat(*RANK)
        stack.wait(lambda n=n: restarts_done(stack) == n, 60, f"automatic restart {n}")
        stack.feeder.thaw_heartbeat(*RANK)  # the restart brought it back ...
        stack.wait(lambda: open_heartbeat_incident(stack) is None, 60, f"incident {n} resolved")
    stack.feeder.freeze_heartbeat(*RANK)  # ... and it fails a fourth time

    def escalated() -> dict[str, Any] | None:
        inc = open_heartbeat_incident(stack)
        return inc if inc is not None and inc["tier"] == "heavy" else None

    inc = stack.wait(escalated, 60, "the fourth failure to go heavy")
    [restart] = [a for a in inc["actions"] if a["action"] == "restart_role"]
    assert restart["status"] == "pending_approval"
    spent = [e for e in inc["timeline"] if e["type"] == "guardrail_escalated"]
    assert [e["detail"]["reason"] for e in spent] == [
        "not run: restart budget of rollout/1 spent, 3 in 30 min"
    ]
    # The approval is what the dispatcher would have to wait for: it is listed, and the launcher
    # was still called three times only (a pending_approval row is never due in the outbox).
    approvals = stack.get("/api/v1/approvals")
    assert any(a["incident_id"] == inc["id"] for a in approvals)
    assert restarts_done(stack) == 3
    assert [c["action"] for c in stack.launcher_calls()].count("restart_role") == 6  # start+done x3
