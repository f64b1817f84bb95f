"""Exit causes through the whole product: a script under ``rlguard launch`` fails as real
training scripts do, and the incident RLGuard opens says why, with the line its output printed.
Real server, policy engine and Celery worker (embedded ``rlguard up``), a real node agent, the
real launcher and child processes; nothing faked (a CPU machine cannot run out of GPU memory:
the script raises ``torch.cuda.OutOfMemoryError`` with PyTorch's text)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.cli.demo import DemoStack
from tests.harness import free_port, wait_for
from tests.unit.integrations._launcher import HERE, Launch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
JOB = "failing-job"
FAILING = HERE / "_failing_script.py"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[DemoStack]:
    s = DemoStack(tmp_path, free_port(), job=JOB, schedule=None)
    try:
        s.start_server()
        s.start_agent()
        yield s
    finally:
        s.stop()


def _incidents(stack: DemoStack) -> list[dict[str, Any]]:
    return [i for i in stack.incidents() if i["subject"].get("job") == JOB]


def _fail(stack: DemoStack, how: str, kind: str) -> tuple[dict[str, Any], Launch]:
    # Past the job's first steps (a fault there is a first-step anomaly: heavy); the script
    # then fails once, and RLGuard's restart runs it again (it fails again the same way).
    launch = Launch(
        stack.run_dir,
        "--role",
        "trainer",
        "--job",
        JOB,
        "--backoff",
        "0",
        script=FAILING,
        script_args=("--fail", how, "--at", "8"),
    )
    try:
        launch.wait(lambda: launch.events("child_exit"), "the script to fail", timeout=60)
        inc = wait_for(
            lambda: next(
                (stack.incident(i["id"]) for i in _incidents(stack) if i["kind"] == kind), None
            ),
            60,
            f"a {kind} incident",
            context=launch.logs,
        )
    except BaseException:
        launch.close()
        raise
    return inc, launch


def test_a_cuda_oom_opens_cuda_oom_with_the_line_and_the_same_oom_again_goes_to_a_person(
    stack: DemoStack,
) -> None:
    inc, launch = _fail(stack, "oom", "cuda_oom")
    try:
        assert inc["tier"] == "medium" and inc["subject"]["role"] == "trainer"
        text = json.dumps(inc)
        assert '"exit_cause": "cuda_oom"' in text
        assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB" in text

        # restart_role ran; the restarted script dies of the same OOM at the same step: the
        # incident escalates to heavy instead of restarting into it again.
        def escalated() -> dict[str, Any] | None:
            now = stack.incident(inc["id"])
            return now if now["tier"] == "heavy" else None

        heavy = wait_for(escalated, 90, "the second OOM at step 8 to escalate", context=launch.logs)
        assert heavy["escalated"] and any("step 8 failed 2 times" in r for r in heavy["reasons"])
        assert len(launch.events("spawn")) == 2  # restarted once, not into the OOM again
    finally:
        launch.close()


def test_an_nccl_watchdog_timeout_opens_collective_timeout_for_the_role(stack: DemoStack) -> None:
    inc, launch = _fail(stack, "nccl", "collective_timeout")
    try:
        assert inc["subject"] == {"job": JOB, "role": "trainer"}
        assert "Watchdog caught collective operation timeout" in json.dumps(inc)
    finally:
        launch.close()


def test_a_silent_sigkill_is_heartbeat_lost_with_no_cause_as_before(stack: DemoStack) -> None:
    inc, launch = _fail(stack, "sigkill", "heartbeat_lost")
    try:
        assert "exit_cause" not in json.dumps(inc)
        assert not [i for i in _incidents(stack) if i["kind"] in ("cuda_oom", "host_oom")]
    finally:
        launch.close()
