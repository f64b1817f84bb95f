"""The cross-role deadlock on the real reference job (``workload``, under its own launcher as the
launcher hook, watched by the embedded ``rlguard up`` and a node agent): chaos ``starve`` leaves
every rollout alive, heartbeat fresh, idle with nothing pending, so the trainer waits in ROLLOUT
for a batch that never comes (verl #7155). The windows are short for a test, train_hang's
(counted from the trainer's last step) shorter than the deadlock's (counted from the rollouts'
idleness): the race the reference job lost before, when train_hang opened first and the trainer
was restarted. Now: one job-level ``cross_role_deadlock`` (medium, ``restart_role`` of the
rollouts), no ``train_hang``, and training goes on once the restarted rollouts generate again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.cli.demo import DemoStack
from tests.harness import free_port, wait_for
from workload.chaos import Fault, inject
from workload.job import RunDir, read_events, read_json

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(360)]
JOB = "ref-deadlock"
HANG_MIN = 10  # detection.trainer.hang_min_seconds here (120 in policy.yaml)
SUSTAIN = 20  # detection.deadlock.sustain_seconds here (90 in policy.yaml)


def _short_windows(data: dict[str, Any]) -> None:
    data["detection"]["trainer"].update(hang_min_seconds=HANG_MIN, hang_step_factor=3)
    data["detection"]["deadlock"]["sustain_seconds"] = SUSTAIN
    data["incidents"]["quiet_period_seconds"] = 3


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[DemoStack]:
    s = DemoStack(
        tmp_path,
        free_port(),
        job=JOB,
        steps=400,
        decode_ms=10.0,
        schedule=None,
        policy_edit=_short_windows,
    )
    try:
        s.start_server()
        s.start_agent()
        s.start_job()
        yield s
    finally:
        s.stop()


def _step(run: RunDir) -> int:
    return max((e["step"] for e in read_events(run) if e["kind"] == "step"), default=-1)


def _rollout_pids(run: RunDir) -> dict[str, int]:
    pids = read_json(run.root / "pids.json") or {}
    return {k: v for k, v in pids.items() if k.startswith("rollout-") and isinstance(v, int)}


def _of_job(stack: DemoStack, kind: str) -> list[dict[str, Any]]:
    return [i for i in stack.incidents() if i["kind"] == kind and i["subject"].get("job") == JOB]


def test_starved_rollouts_are_one_deadlock_that_restarts_them_not_a_train_hang(
    stack: DemoStack,
) -> None:
    run = RunDir(stack.run_dir)

    def logs() -> str:
        out = [
            f"--- {f.name}\n{f.read_text(errors='replace')[-1500:]}"
            for f in sorted((stack.workdir / "logs").glob("*.log"))
        ]
        out += [
            f"--- run {f.name}\n{f.read_text(errors='replace')[-1500:]}"
            for f in sorted((run.root / "logs").glob("*.log"))
        ]
        out.append(
            f"--- incidents {[(i['kind'], i['subject'], i['status']) for i in stack.incidents()]}"
        )
        return "\n".join(out)

    # Past the first steps and long enough for train_hang to know the trainer's pace, so that
    # its clock runs (hang_min_steps step times seen): the race is real.
    wait_for(lambda: _step(run) >= 8, 180, "step 8", context=logs)
    starved = _rollout_pids(run)
    assert len(starved) == 2, starved
    inject(run, Fault("starve"))

    [row] = wait_for(
        lambda: _of_job(stack, "cross_role_deadlock"), 120, "the deadlock", context=logs
    )
    assert row["subject"] == {"job": JOB, "role": "rollout"}, row
    assert row["tier"] == "medium", row

    def restarted() -> dict[str, Any] | None:
        acts = stack.incident(row["id"])["actions"]
        return acts[0] if acts and acts[0]["status"] in ("succeeded", "failed") else None

    act = wait_for(restarted, 90, "the plan to finish", context=logs)
    inc = stack.incident(row["id"])
    assert [
        (a["action"], a["params"].get("role"), a["params"].get("rank")) for a in inc["actions"]
    ] == [("restart_role", "rollout", None)], inc["actions"]
    assert act["status"] == "succeeded", act
    extra = inc["evidence"]["extra"]
    assert extra["trainers"] == ["trainer-0"] and extra["rollouts"] == ["rollout-0", "rollout-1"]

    # The restarted rollouts (new processes, not starved) generate: the trainer trains again.
    wait_for(
        lambda: set(_rollout_pids(run).values()).isdisjoint(starved.values()),
        60,
        "new rollout processes",
        context=logs,
    )
    step = _step(run)
    wait_for(lambda: _step(run) >= step + 2, 120, "training to go on", context=logs)
    # By now train_hang's window has long passed: one incident for the job, no hang.
    assert len(_of_job(stack, "cross_role_deadlock")) == 1, logs()
    assert _of_job(stack, "train_hang") == [], logs()
