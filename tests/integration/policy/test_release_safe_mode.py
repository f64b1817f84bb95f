"""Leaving SAFE_MODE: a heavy incident's plan is rejected, the job stays held, an approver
releases it through ``POST /api/v1/jobs/{job}/release``; a real Celery worker clears the control
file on each node and a real PhaseMachine in the run directory leaves SAFE_MODE.

Both modes (embedded SQLite + kombu's SQLAlchemy broker; PostgreSQL + Redis) with a real worker
process, faults fed only through ``POST /api/v1/ingest`` as in ``tests/integration/policy``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from app.tasks.recovery_adapters import read_mode
from recovery.phases import Event, Phase, PhaseMachine
from recovery.statelog import StateLog
from tests.harness.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

JOB, CALM = "grpo-held", "grpo-calm"


def _release(stack: Stack, job: str, token: str | None = None, **body: Any) -> Any:
    return stack.post(f"/api/v1/jobs/{job}/release", token, json=body)


def _open(stack: Stack, kind: str, job: str) -> list[dict[str, Any]]:
    return [
        i
        for i in stack.incidents()
        if i["kind"] == kind and i["job"] == job and i["status"] == "open"
    ]


def test_an_approver_releases_a_rejected_job_from_safe_mode(any_stack: Stack) -> None:
    stack = any_stack
    run_dir = stack.run_dir(JOB)
    stack.run_dir(CALM)
    log = StateLog(run_dir / "state_log.jsonl")
    machine = PhaseMachine(log, run_dir=run_dir)
    machine.fire(Event.START)
    machine.fire(Event.PREPARED)
    stack.start_server()
    stack.start_worker("--node", "n0", "--node", "n1", "--cluster")
    f = stack.feeder
    for job in (JOB, CALM):
        f.participant("n0", "trainer", 0, job=job)
        f.participant("n1", "rollout", 0, job=job, phase="ROLLOUT")
        f.set("n0", "state_log_write_errors_total", 0, job=job, role="trainer", rank="0")
    f.start()
    try:
        stack.wait_baselines()
        f.set("n0", "state_log_write_errors_total", 2, job=JOB, role="trainer", rank="0")

        def held() -> dict[str, Any] | None:
            inc = stack.incident("storage_unwritable", JOB)
            safe = [a for a in (inc or {}).get("actions", []) if a["action"] == "enter_safe_mode"]
            done = len(safe) == 2 and all(a["status"] == "succeeded" for a in safe)
            return inc if inc is not None and inc["safe_mode"] and done else None

        inc = stack.wait(held, 60, "SAFE_MODE on both nodes")
        assert read_mode(run_dir) == "safe_mode"
        assert not machine.can_start_rollout() and machine.phase is Phase.SAFE_MODE

        # While the approval is pending, the approver decides there, not here.
        r = _release(stack, JOB, comment="too early")
        assert r.status_code == 409 and "still pending" in r.json()["detail"], r.text
        [approval] = stack.get("/api/v1/approvals?status=pending", stack.viewer)
        r = stack.post(
            f"/api/v1/approvals/{approval['id']}/reject", json={"comment": "not a restore"}
        )
        assert r.status_code == 200

        # Bad input and roles: refused with a reason, nothing planned.
        before = len(stack.incident("storage_unwritable", JOB)["actions"])  # type: ignore[index]
        r = stack.http.post(f"/api/v1/jobs/{JOB}/release", json={"comment": "x"})
        assert r.status_code == 401
        r = _release(stack, JOB, stack.viewer, comment="let it run")
        assert r.status_code == 403 and "approver role" in r.json()["detail"]
        r = stack.post(f"/api/v1/jobs/{JOB}/release", json={})
        assert r.status_code == 422 and "comment" in r.text
        r = _release(stack, JOB, comment="   ")
        assert r.status_code == 422 and "comment must say why" in r.json()["detail"]
        r = _release(stack, JOB, comment="y" * 2001)
        assert r.status_code == 422 and "2001 characters" in r.json()["detail"]
        r = _release(stack, "no-such-job", comment="run")
        assert r.status_code == 404 and "no job named 'no-such-job'" in r.json()["detail"]
        r = _release(stack, CALM, comment="run")
        assert r.status_code == 409 and f"job '{CALM}' is not in SAFE_MODE" in r.json()["detail"]
        after = stack.incident("storage_unwritable", JOB)
        assert after is not None and len(after["actions"]) == before and after["status"] == "open"
        assert read_mode(run_dir) == "safe_mode"

        r = _release(stack, JOB, comment="disk remounted rw, checked by hand")
        assert r.status_code == 202, r.text
        body = r.json()
        assert body["released_by"] == "alice" and body["incidents"] == [inc["id"]]
        assert sorted(a["node"] for a in body["actions"]) == ["n0", "n1"]

        def closed() -> dict[str, Any] | None:
            detail = stack.get(f"/api/v1/incidents/{inc['id']}", stack.viewer)
            return detail if detail["status"] == "resolved" else None

        done = stack.wait(closed, 60, "incident closed by the release")
        assert not done["safe_mode"]
        releases = [a for a in done["actions"] if a["action"] == "release_safe_mode"]
        assert len(releases) == 2 and all(a["status"] == "succeeded" for a in releases)
        entry = next(e for e in done["timeline"] if e["type"] == "safe_mode_released")
        assert entry["actor"] == "user:alice"
        assert entry["detail"]["comment"] == "disk remounted rw, checked by hand"
        assert done["timeline"][-1]["type"] == "resolved"
        assert done["timeline"][-1]["actor"] == "user:alice"
        assert read_mode(run_dir) == "run"
        # The job's own phase machine obeys: out of SAFE_MODE, rollouts may start again.
        assert machine.tick() is Phase.PREPARE and machine.can_start_rollout()

        # Released once: a second release is a conflict, and the same occurrence of the
        # signal (the counter still reads 2) does not open the incident again.
        r = _release(stack, JOB, comment="again")
        assert r.status_code == 409
        time.sleep(2)  # the scenario: absence over a few policy ticks (0.5 s each)
        assert _open(stack, "storage_unwritable", JOB) == []
    finally:
        log.close()
