"""``rlguard launch`` under the whole product: a generic training script (heartbeat API only) is
killed with kill -9 and RLGuard brings it back. Real server, policy engine and Celery worker
(embedded ``rlguard up``), a real node agent, the launcher hook the worker runs, and the launcher
carrying the restart out with the integration's resume arguments."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.cli.demo import DemoStack
from tests.harness import free_port, wait_for
from tests.unit.integrations._launcher import TEST_INTEGRATION, Launch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
JOB = "generic-job"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[DemoStack]:
    s = DemoStack(tmp_path, free_port(), job=JOB, schedule=None)
    try:
        s.start_server()
        s.start_agent()
        yield s
    finally:
        s.stop()


def _incident(stack: DemoStack, kind: str) -> dict[str, Any] | None:
    for inc in stack.incidents():
        if inc["kind"] == kind and inc["subject"].get("job") == JOB:
            return stack.incident(inc["id"])
    return None


def test_a_killed_script_is_restarted_by_rlguard_with_its_resume_arguments(
    stack: DemoStack,
) -> None:
    launch = Launch(
        stack.run_dir,
        "--role",
        "trainer",
        "--job",
        JOB,
        "--integration",
        TEST_INTEGRATION,
        script_args=("--lr", "0.1"),
    )
    try:
        logs = launch.logs
        # Past the job's first steps: a fault there is a first-step anomaly (heavy, approval).
        launch.wait(lambda: (launch.beat().get("step") or 0) >= 5, "the script to train")

        def training_seen() -> bool:
            jobs = stack.api("GET", "/api/v1/jobs").json()["data"]
            return any(j["name"] == JOB and j["phases"].get("TRAIN") == 1 for j in jobs)

        wait_for(training_seen, 60, "the server to see the job train", context=logs)
        dead = launch.kill_child()

        inc = wait_for(
            lambda: _incident(stack, "heartbeat_lost"),
            60,
            "a heartbeat_lost incident",
            context=logs,
        )
        assert inc["tier"] == "medium"
        assert inc["subject"]["role"] == "trainer" and str(inc["subject"]["rank"]) == "0"

        def restarted() -> str | None:
            acts = [
                a for a in stack.incident(inc["id"])["actions"] if a["action"] == "restart_role"
            ]
            return (
                acts[0]["status"] if acts and acts[0]["status"] in ("succeeded", "failed") else None
            )

        assert wait_for(restarted, 90, "restart_role to finish", context=logs) == "succeeded"
        starts = launch.wait(lambda: launch.starts()[1:] and launch.starts(), "the second start")
        assert starts[0]["argv"] == ["--lr", "0.1"]
        assert starts[1]["argv"] == ["--lr", "0.1", "--resumed-from", "1"]
        assert starts[1]["pid"] != dead
        launch.wait(
            lambda: (
                launch.beat().get("pid") == starts[1]["pid"]
                and launch.beat().get("phase") == "TRAIN"
            ),
            "the restarted script to train",
        )
        # The hook requests came from the worker (its keys), and the launcher's timeline says so:
        # first the stacks of the lost process (hang forensics: it was gone, which the incident
        # records), then the restart.
        hook = launch.events("hook_request")
        assert [(h["action"], h["role"], str(h["rank"])) for h in hook] == [
            ("capture_stacks", "trainer", "0"),
            ("restart_role", "trainer", "0"),
        ]
        answers = {
            a["action"]: a
            for a in (
                json.loads(p.read_text())
                for p in (stack.run_dir / "recovery" / "launcher").glob("*.done")
            )
        }
        assert sorted(answers) == ["capture_stacks", "restart_role"]
        assert answers["restart_role"]["ok"] is True
        [gone] = answers["capture_stacks"]["stacks"]
        assert gone["pid"] == dead and gone["ok"] is False
        assert gone["reason"].startswith("process gone: it exited")
        [entry] = [
            e for e in stack.incident(inc["id"])["timeline"] if e["type"] == "stacks_captured"
        ]
        assert entry["detail"]["reason"] == gone["reason"]

        (stack.run_dir / "stop").touch()
        assert launch.proc.wait(30) == 0, launch.logs()
    finally:
        launch.close()
