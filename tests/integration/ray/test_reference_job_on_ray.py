"""The reference job in Ray mode (``python -m workload.launch --ray``: trainer and rollout
workers as Ray actors of a local Ray the launcher starts): kill -9 of a rollout actor's worker
process mid-batch -> Ray restarts the actor and its role resumes from the WAL -> the run ends
with the same parameters, bit for bit, as a clean run under the process supervisor, and every
batch the trainer consumed is byte-identical."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from recovery.report import heartbeat_path
from tests.integration.workload._jobs import Job, assert_same_end
from workload.job import read_json

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
STEPS = 3


def test_kill9_of_a_rollout_actor_ends_bit_for_bit_equal_to_the_clean_run(tmp_path: Path) -> None:
    clean = Job(tmp_path / "clean", STEPS)
    on_ray = Job(tmp_path / "on-ray", STEPS, "--ray")
    try:
        on_ray.wait(lambda: on_ray.events("ray_start"), 120, "the Ray actors")
        on_ray.wait(
            lambda: [e for e in on_ray.events("batch_start") if e["step"] == 2 and e["rank"] == 1],
            120,
            "rollout 1 working on step 2",
        )
        beat = read_json(heartbeat_path(on_ray.run.root, "rollout", 1)) or {}
        os.kill(int(beat["pid"]), signal.SIGKILL)
        assert_same_end(on_ray, clean, STEPS)
    finally:
        on_ray.close()
        clean.close()
    assert [(e["rank"], e["step"]) for e in on_ray.events("lost_rollout")] == [(1, 2)]
    after = read_json(heartbeat_path(on_ray.run.root, "rollout", 1)) or {}
    assert after["pid"] != beat["pid"]  # the role ran on in the actor Ray restarted
