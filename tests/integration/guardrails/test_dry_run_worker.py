"""Dry run on the real stack: the job's plan is made and shown, its row is never handed to
Celery, while another job's restart goes through the same outbox and worker."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from tests.harness.stack import JOB, Stack
from tests.integration.policy.test_policy_scenarios import _base_cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

OTHER = "grpo-b"


def open_incident(stack: Stack, job: str) -> dict[str, Any] | None:
    for inc in stack.incidents(status="open"):
        if inc["kind"] == "heartbeat_lost" and inc["job"] == job:
            return stack.get(f"/api/v1/incidents/{inc['id']}", stack.viewer)
    return None


@pytest.mark.timeout(180)
def test_a_dry_run_job_plans_and_shows_but_no_celery_task_runs(redis_stack: Stack) -> None:
    stack = redis_stack
    stack.start_server()
    stack.start_worker("--node", "n0", "--node", "n1", "--cluster")
    _base_cluster(stack)
    stack.feeder.participant("n1", "rollout", 0, job=OTHER, phase="ROLLOUT")
    stack.feeder.start()
    stack.wait_baselines()
    r = stack.http.request(
        "PUT",
        f"/api/v1/jobs/{JOB}/automation",
        json={"dry_run": True},
        headers=stack.auth(stack.approver),
    )
    assert r.status_code == 200 and r.json()["dry_run"] is True, r.text
    stack.feeder.freeze_heartbeat("n0", JOB, "trainer", 1)

    def shown() -> dict[str, Any] | None:
        inc = open_incident(stack, JOB)
        return inc if inc is not None and inc["actions"] else None

    inc = stack.wait(shown, 60, "the dry-run plan")
    [restart] = inc["actions"]
    assert (restart["action"], restart["status"]) == ("restart_role", "dry_run")
    [dry] = [e["detail"]["reason"] for e in inc["timeline"] if e["type"] == "action_dry_run"]
    assert dry == f"dry run (job {JOB}): would run restart_role on job {JOB}, trainer/1, node n0"
    # Another job's restart is sent, run and finished by the same dispatcher and worker after the
    # dry-run row was committed: had that row been due, it would have been sent with it.
    stack.feeder.freeze_heartbeat("n1", OTHER, "rollout", 0)

    def other_done() -> dict[str, Any] | None:
        other = open_incident(stack, OTHER)
        done = other is not None and any(a["status"] == "succeeded" for a in other["actions"])
        return other if done else None

    stack.wait(other_done, 60, f"the restart of {OTHER}")
    calls = [c for c in stack.launcher_calls() if c["action"] == "restart_role"]
    assert {c["opts"].get("--job") for c in calls} == {OTHER}
    with stack.engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT status, dispatch_count, dispatched_at FROM recovery_action WHERE id = :i"
            ),
            {"i": restart["id"]},
        ).one()
    assert tuple(row) == ("dry_run", 0, None)
