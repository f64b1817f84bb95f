"""The reference job in Ray mode under the whole product, the restart being RLGuard's own.

``python -m workload.launch --ray --ray-address GCS --ray-restart-by rlguard --rollouts 1`` on
the session's local Ray, with the real server (policy engine, embedded Celery worker whose
launcher hook is the Ray hook) and a real ``rlguard agent --ray``. The job's actors are created
with ``max_restarts=0`` (as verl creates its workers), so Ray alone never restarts a dead one,
and with one rollout worker nobody else generates its batches: without RLGuard the job would
wait forever. The restarter's warm standby for the rollout is killed while it waits (the restarter
makes another), then kill -9 of the rollout actor's worker process mid-batch (step 3 or later)
-> the actor is DEAD in
Ray -> heartbeat_lost with Ray's death cause within 5 s -> restart_role -> the Ray hook asks
the job's restarter actor (integrations.ray.restarter) to create the actor again (it activates
its warm standby, an actor already created and waiting) -> the role
resumes from the WAL (its lost batch redone) -> the job completes with final parameters
bit-identical to a clean run under the process supervisor, every consumed batch byte-identical.
A standby frozen while it waits is not handed the restart: the restart is made cold.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.cli.demo import DemoStack
from recovery.report import heartbeat_path
from tests.harness import wait_for
from tests.integration.ray._ray import LocalRay, ray_stack
from tests.integration.workload._jobs import Job, assert_same_end
from workload.job import read_json
from workload.ray_mode import rlguard_preset

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
JOB = "ref-on-ray"
STEPS = 14  # the kill is in step 3 or later (a fault in the first step is escalated to heavy), with
# room for two standbys to be made first


@pytest.fixture
def stack(tmp_path: Path, local_ray: LocalRay) -> Iterator[DemoStack]:
    with ray_stack(tmp_path, local_ray, JOB, rlguard_preset(JOB), tmp_path / "verl.jsonl") as s:
        yield s


def _incident(stack: DemoStack) -> dict[str, Any] | None:
    for inc in stack.incidents():
        if inc["kind"] == "heartbeat_lost" and inc["subject"].get("job") == JOB:
            return stack.incident(inc["id"])
    return None


def _restart_role(stack: DemoStack, inc: dict[str, Any]) -> dict[str, Any] | None:
    acts = [a for a in stack.incident(inc["id"])["actions"] if a["action"] == "restart_role"]
    return acts[0] if acts and acts[0]["status"] in ("succeeded", "failed") else None


def _jobs(
    stack: DemoStack, local_ray: LocalRay, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Job, Job]:
    """A clean run under the process supervisor, and the same job on Ray restarted by RLGuard."""
    clean = Job(tmp_path / "clean", STEPS, "--rollouts", "1")
    # The controller writes verl's file-logger lines there, as verl's does (workload.ray_mode).
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "verl.jsonl"))
    # Its run directory is in the recovery worker's run root (SAFE_MODE's control file).
    on_ray = Job(
        stack.run_root / JOB,
        STEPS,
        "--rollouts",
        "1",
        "--ray",
        "--ray-address",
        local_ray.gcs_address,
        "--ray-restart-by",
        "rlguard",
    )
    return clean, on_ray


def _kill(job: Job, role: str, rank: int) -> dict[str, Any]:
    """kill -9 of the process the role's heartbeat names; that heartbeat."""
    beat = read_json(heartbeat_path(job.run.root, role, rank)) or {}
    os.kill(int(beat["pid"]), signal.SIGKILL)
    return beat


def _standby_waiting(on_ray: Job, name: str) -> dict[str, Any]:
    """The standby ``name``'s ready event, once the restarter knows it waits for its activation
    (only such a standby is handed a restart: one that has not asked yet cannot be proven)."""
    on_ray.wait(
        lambda: [e for e in on_ray.events("ray_standby_waiting") if e["name"] == name],
        150,
        f"the standby {name} waiting for its activation",
    )
    [ready] = [e for e in on_ray.events("ray_standby_ready") if e["name"] == name]
    return ready


def _first_rollout_standby(on_ray: Job) -> dict[str, Any]:
    """The restarter's first warm standby for rollout 0, once it waits for its activation."""
    return _standby_waiting(on_ray, f"{JOB}_rollout_0_r1")


def _kill_rollout_in_the_next_batch(on_ray: Job) -> tuple[int, dict[str, Any]]:
    """kill -9 of rollout 0 in the next batch it starts, from step 3 on (a fault in the first
    step is escalated to heavy): that step and the killed heartbeat."""
    started = {e["step"] for e in on_ray.events("batch_start")}
    kill_step = max(3, max(started, default=0) + 1)
    assert kill_step < STEPS, f"the job reached step {kill_step - 1} before its standby existed"
    on_ray.wait(
        lambda: [e for e in on_ray.events("batch_start") if e["step"] == kill_step],
        150,
        f"rollout 0 working on step {kill_step}",
    )
    return kill_step, _kill(on_ray, "rollout", 0)


def _restarted(stack: DemoStack, inc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The incident's restart_role once it succeeded, and the hook's answer."""
    action = wait_for(lambda: _restart_role(stack, inc), 60, "restart_role to finish")
    assert action["status"] == "succeeded", json.dumps(action)[:2000]
    return action, json.loads(action["result"]["stdout"])


def test_kill9_of_a_rollout_actor_is_healed_by_rlguards_restart_role_bit_for_bit(
    stack: DemoStack, local_ray: LocalRay, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clean, on_ray = _jobs(stack, local_ray, tmp_path, monkeypatch)
    try:
        # The restarter's warm standby for rollout 0 (an actor waiting in its creation) dies
        # while it waits: the restarter notices and makes another.
        first = _first_rollout_standby(on_ray)
        os.kill(int(first["pid"]), signal.SIGKILL)
        lost = on_ray.wait(
            lambda: on_ray.events("ray_standby_lost"), 60, "the dead standby noticed"
        )
        assert [e["name"] for e in lost] == [f"{JOB}_rollout_0_r1"], lost
        _standby_waiting(on_ray, f"{JOB}_rollout_0_r2")  # a new standby for rollout 0
        # Then the kill of the rollout in the next batch that starts, from step 3 on.
        kill_step, beat = _kill_rollout_in_the_next_batch(on_ray)
        killed = time.monotonic()
        inc = wait_for(lambda: _incident(stack), 30, "a heartbeat_lost incident for the job")
        detect_s = time.monotonic() - killed
        text = json.dumps(inc)
        assert inc["subject"]["role"] == "rollout" and str(inc["subject"]["rank"]) == "0", text[
            :2000
        ]
        assert "Ray death cause" in text and "DEAD in Ray" in text, text[:3000]
        assert detect_s <= 5.0, f"incident {detect_s:.1f} s after the kill"
        action, done = _restarted(stack, inc)
        assert done["via"] == "restarter" and done["already"] is False, done
        assert done["death_reason"] == "WORKER_DIED" and done["name"] == f"{JOB}_rollout_0_r2", done
        assert done["warm"] is True, done  # the standby became the role
        # A second delivery of the same action creates nothing (the restarter's and the hook's
        # records of the idempotency key).
        again = subprocess.run(
            [
                str(stack.workdir / "launcher-hook"),
                "restart_role",
                "--job",
                JOB,
                "--role",
                "rollout",
                "--rank",
                "0",
                "--idempotency-key",
                action["idempotency_key"],
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert again.returncode == 0, again.stderr[-2000:]
        assert json.loads(again.stdout)["already"] is True
        assert json.loads(again.stdout)["actor_id"] == done["actor_id"]
        assert_same_end(on_ray, clean, STEPS)
    finally:
        on_ray.close()
        clean.close()
    assert [(e["rank"], e["step"]) for e in on_ray.events("lost_rollout")] == [(0, kill_step)]
    # Ray did not bring the actor back: RLGuard's restart_role did, once.
    assert [(e["role"], e["rank"]) for e in on_ray.events("ray_role_recreated")] == [("rollout", 0)]
    after = read_json(heartbeat_path(on_ray.run.root, "rollout", 0)) or {}
    assert after["pid"] != beat["pid"]
    print(f"kill -9 -> incident in {detect_s:.1f} s (loaded machine)")


def test_a_frozen_standby_is_not_handed_the_restart_which_is_made_cold(
    stack: DemoStack, local_ray: LocalRay, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A standby whose process is frozen (SIGSTOP) looks alive to Ray and to the restarter's
    # check; so does one that died a moment before the restart, before Ray marked it dead.
    # Activated, it never finishes its creation: the restarter must see that and go cold, or
    # the role stays dead and the job waits forever.
    clean, on_ray = _jobs(stack, local_ray, tmp_path, monkeypatch)
    try:
        standby = _first_rollout_standby(on_ray)
        os.kill(int(standby["pid"]), signal.SIGSTOP)
        _kill_rollout_in_the_next_batch(on_ray)
        inc = wait_for(lambda: _incident(stack), 30, "a heartbeat_lost incident for the job")
        _action, done = _restarted(stack, inc)
        assert done["via"] == "restarter" and done["warm"] is False, done
        assert done["name"] == f"{JOB}_rollout_0_r2", done  # a new actor, not the frozen one
        assert_same_end(on_ray, clean, STEPS)
    finally:
        on_ray.close()
        clean.close()
    lost = on_ray.events("ray_standby_lost")
    assert [(e["name"], e.get("at")) for e in lost] == [(f"{JOB}_rollout_0_r1", "activation")], lost
    assert [(e["role"], e["warm"]) for e in on_ray.events("ray_role_recreated")] == [
        ("rollout", False)
    ]


def test_kill9_of_the_trainer_actor_is_healed_warm_bit_for_bit(
    stack: DemoStack, local_ray: LocalRay, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The trainer's death: the driver waits on the restarter for the trainer's exit code, and
    # the restarted trainer resumes from the newest checkpoint under its next incarnation.
    clean, on_ray = _jobs(stack, local_ray, tmp_path, monkeypatch)
    try:
        _standby_waiting(on_ray, f"{JOB}_trainer_0_r1")  # the restarter's standby for the trainer
        steps = {e["step"] for e in on_ray.events("step")}
        kill_after = max(3, max(steps, default=0) + 1)
        assert kill_after < STEPS - 1, f"the job reached step {kill_after - 1} before its standby"
        on_ray.wait_step(kill_after)
        beat = _kill(on_ray, "trainer", 0)
        inc = wait_for(lambda: _incident(stack), 30, "a heartbeat_lost incident for the job")
        assert inc["subject"]["role"] == "trainer", json.dumps(inc)[:2000]
        _action, done = _restarted(stack, inc)
        assert done["via"] == "restarter" and done["warm"] is True, done
        assert done["name"] == f"{JOB}_trainer_0_r1", done
        assert_same_end(on_ray, clean, STEPS)
    finally:
        on_ray.close()
        clean.close()
    assert [(e["role"], e["rank"]) for e in on_ray.events("ray_role_recreated")] == [("trainer", 0)]
    after = read_json(heartbeat_path(on_ray.run.root, "trainer", 0)) or {}
    assert after["pid"] != beat["pid"]
