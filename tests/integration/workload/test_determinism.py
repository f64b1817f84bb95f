"""A run with two faults (kill -9 of a rollout worker mid-batch, kill -9 of the trainer) and
role-local restarts through the launcher hook ends with the same parameters as a clean run,
bit for bit, and reuses the batches committed before each fault unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery.report import heartbeat_path
from workload.chaos import Fault, inject
from workload.job import read_json

from ._jobs import Job, assert_same_end

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(240)]
STEPS = 6


def test_two_faults_end_bit_for_bit_equal_to_the_clean_run(tmp_path: Path) -> None:
    clean = Job(tmp_path / "clean", STEPS)
    faulty = Job(tmp_path / "faulty", STEPS)
    try:
        faulty.wait_step(1)
        faulty.wait(
            lambda: [e for e in faulty.events("batch_start") if e["step"] == 2 and e["rank"] == 1],
            60,
            "rollout 1 working on step 2",
        )
        inject(faulty.run, Fault("kill", role="rollout", rank=1))
        faulty.wait(
            lambda: faulty.events("child_exit"), 30, "the supervisor to see the dead rollout"
        )
        # The supervisor says so in the dead process's heartbeat at once (the agent forwards it).
        beat = read_json(heartbeat_path(faulty.run.root, "rollout", 1)) or {}
        assert beat["phase"] == "EXITED" and beat["exit_code"] == -9, beat
        r = faulty.hook("restart_role", "--role", "rollout", "--rank", "1", key="t-rollout-1")
        assert r.returncode == 0, r.stderr
        again = faulty.hook("restart_role", "--role", "rollout", "--rank", "1", key="t-rollout-1")
        assert (
            again.returncode == 0 and again.stdout == r.stdout
        )  # idempotent: answered, not redone
        faulty.wait_step(3)
        inject(faulty.run, Fault("kill", role="trainer"))
        r = faulty.hook("restart_role", "--role", "trainer", key="t-trainer")
        assert r.returncode == 0, r.stderr
        assert_same_end(faulty, clean, STEPS)
    finally:
        faulty.close()
        clean.close()
    lost = faulty.events("lost_rollout")
    assert [(e["rank"], e["step"]) for e in lost] == [(1, 2)]
    restarts = [e["roles"] for e in faulty.events("restart")]
    assert restarts == [["rollout-1"], ["trainer-0"]]
    # Both restarts took over a warm standby; the first start of each role was cold.
    spawns = [(e["role"], e["warm"]) for e in faulty.events("spawn")]
    assert spawns == [
        ("trainer", False),
        ("rollout", False),
        ("rollout", False),
        ("rollout", True),
        ("trainer", True),
    ]
    assert faulty.events("trainer_restored"), "the restarted trainer resumed from a checkpoint"
