"""The ledger on a heavy incident the real stack makes: server process with its policy engine,
a real Celery worker, embedded SQLite and broker, reports only through ``POST /api/v1/ingest``.
A storage fault puts the job in SAFE_MODE; the approver rejects the restore and later releases
the job; the time the job waited for an approver is charged to "approval", to the millisecond
of the incident's own timeline."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

import pytest

from tests.harness.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

JOB = "grpo-held"
STEP_SECONDS = 0.5


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_safe_mode_wait_is_charged_to_approval(embedded_stack: Stack) -> None:
    stack = embedded_stack
    stack.run_dir(JOB)
    stack.start_server()
    stack.start_worker("--node", "n0", "--node", "n1", "--cluster")
    f = stack.feeder
    f.participant("n0", "trainer", 0, job=JOB, step=1)
    f.participant("n1", "rollout", 0, job=JOB, phase="ROLLOUT", step=1)
    f.set("n0", "state_log_write_errors_total", 0, job=JOB, role="trainer", rank="0")
    f.start()
    # The job trains a step every STEP_SECONDS unless SAFE_MODE holds it.
    training, halt, step = threading.Event(), threading.Event(), [1]

    def train() -> None:
        while not halt.wait(STEP_SECONDS):
            if training.is_set():
                step[0] += 1
                f.participant("n0", "trainer", 0, job=JOB, step=step[0])

    trainer = threading.Thread(target=train, daemon=True, name="steps")
    trainer.start()
    try:
        stack.wait_baselines()
        training.set()
        stack.wait(lambda: step[0] >= 5, 30, "a few steps")
        training.clear()  # the storage fault stops the job
        f.set("n0", "state_log_write_errors_total", 2, job=JOB, role="trainer", rank="0")

        def held() -> dict[str, Any] | None:
            inc = stack.incident("storage_unwritable", JOB)
            safe = [a for a in (inc or {}).get("actions", []) if a["action"] == "enter_safe_mode"]
            done = safe and all(a["status"] == "succeeded" for a in safe)
            return inc if inc is not None and inc["safe_mode"] and done else None

        inc = stack.wait(held, 60, "SAFE_MODE")
        [approval] = stack.get("/api/v1/approvals?status=pending", stack.viewer)
        r = stack.post(f"/api/v1/approvals/{approval['id']}/reject", json={"comment": "no restore"})
        assert r.status_code == 200, r.text
        r = stack.post(f"/api/v1/jobs/{JOB}/release", json={"comment": "disk remounted"})
        assert r.status_code == 202, r.text

        def closed() -> dict[str, Any] | None:
            d = stack.get(f"/api/v1/incidents/{inc['id']}", stack.viewer)
            return d if d["status"] == "resolved" else None

        detail = stack.wait(closed, 60, "incident resolved by the release")
        training.set()  # released: the job trains again

        def resumed() -> dict[str, Any] | None:
            g = stack.get(f"/api/v1/jobs/{JOB}/goodput?since=1h", stack.viewer)
            row = next(i for i in g["incidents"] if i["id"] == inc["id"])
            return g if not row["ongoing"] else None

        g = stack.wait(resumed, 30, "a new step after the release")
    finally:
        halt.set()
        trainer.join(5)
    row = next(i for i in g["incidents"] if i["id"] == inc["id"])
    at = {e["type"]: _ts(e["at"]) for e in detail["timeline"]}
    seg = row["segments"]
    # Approval: requested with the plan -> an approver asked for the release (the rejection in
    # between left the job waiting in SAFE_MODE).
    assert seg["approve"] == pytest.approx(
        at["release_requested"] - at["approval_requested"], abs=1e-3
    )
    assert seg["approve"] > 0
    assert _ts(row["detected_at"]) == pytest.approx(at["opened"], abs=1e-3)
    delay = detail["detection_delay_seconds"] or 0.0
    assert _ts(row["detected_at"]) - _ts(row["fault_at"]) == pytest.approx(delay, abs=1e-3)
    releases = [a for a in detail["actions"] if a["action"] == "release_safe_mode"]
    assert _ts(row["recovered_at"]) == pytest.approx(
        max(_ts(a["finished_at"]) for a in releases), abs=1e-3
    )
    assert _ts(row["resumed_at"]) > _ts(row["recovered_at"])
    assert sum(seg.values()) == pytest.approx(row["lost_seconds"], abs=1e-6)
    assert row["lost_seconds"] >= seg["approve"] and g["ettr"] < 1.0
