"""The Ray collector and the Ray hook against a real local Ray (no mocks of Ray).

kill -9 of an actor's worker process -> the collector reports it DEAD with Ray's death cause
within 5 s; actors mapped by the verl and OpenRLHF presets; a class no rule matches is named
once and left out; an unreachable address is said and the collector keeps trying. The hook's
restart_role kills a named actor so Ray restarts it, once per idempotency key, and refuses a
dead one; restart_job stops a Jobs API job and submits it again with verl's resume flag, once,
and refuses a job that was not submitted through the Jobs API or has a blank entrypoint.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from integrations.ray.collector import PHASE_DEAD, PHASE_RUNNING, RayCollector
from integrations.ray.presets import load_preset
from integrations.ray.state import RayStateReader
from recovery.protocol.samples import ParticipantReport
from tests.harness import free_port, spawn, wait_for
from tests.integration.ray._ray import LocalRay, actor_pid, env_for_subprocess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]
JOB = "verl-job"


def _participant(collector: RayCollector, role: str, rank: int) -> ParticipantReport | None:
    collector.poll_once()
    _samples, participants = collector.collect()
    for p in participants:
        if (p.job, p.role, p.rank) == (JOB, role, rank):
            return p
    return None


def _hook(ray_: LocalRay, state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [
        sys.executable,
        "-m",
        "integrations.ray.hook",
        *args,
        "--dashboard",
        ray_.dashboard,
        "--ray-address",
        ray_.gcs_address,
        "--state-dir",
        str(state_dir),
        "--timeout",
        "60",
    ]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=120, env=env_for_subprocess(), check=False
    )


def test_kill9_is_dead_with_rays_cause_within_5s_and_unknown_classes_are_named(
    local_ray: LocalRay, caplog: pytest.LogCaptureFixture
) -> None:
    import ray

    from tests.integration.ray.actors import SomethingElse, vLLMHttpServer

    rollout = vLLMHttpServer.options(name="vllm_server_3_0", max_restarts=0).remote()
    other = SomethingElse.options(name="helper").remote()
    pid = actor_pid(rollout)
    actor_pid(other)
    collector = RayCollector(
        load_preset("verl"), address=local_ray.dashboard, job_name=JOB, interval=0.5
    )
    with caplog.at_level(logging.WARNING, logger="rlguard.agent.ray"):
        first = wait_for(lambda: _participant(collector, "rollout", 3), 20, "the rollout actor")
    assert first.phase == PHASE_RUNNING
    # Only this class's line: the session's Ray also holds the actors other tests left.
    named = [
        r.getMessage()
        for r in caplog.records
        if "matches no role" in r.getMessage() and "'SomethingElse'" in r.getMessage()
    ]
    assert len(named) == 1 and "'verl'" in named[0], named
    _s, participants = collector.collect()
    assert {p.role for p in participants if p.job == JOB} == {"rollout"}

    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()

    def dead() -> ParticipantReport | None:
        p = _participant(collector, "rollout", 3)
        return p if p is not None and p.phase == PHASE_DEAD else None

    wait_for(dead, 5, "the collector to report the killed actor DEAD")
    assert time.monotonic() - killed_at < 5
    samples, _p = collector.collect()
    cause = [s for s in samples if s["name"] == "ray_actor_dead" and s["labels"]["rank"] == "3"]
    assert cause and cause[0]["labels"]["reason"] == "WORKER_DIED"
    assert cause[0]["value"] == pid
    ray.kill(other, no_restart=True)


def test_openrlhf_preset_maps_its_actor_classes(local_ray: LocalRay) -> None:
    import ray

    from tests.integration.ray.actors import PolicyModelActor

    actors = [PolicyModelActor.remote() for _ in range(2)]
    for a in actors:
        actor_pid(a)
    snap = RayStateReader(local_ray.dashboard).snapshot()
    collector = RayCollector(load_preset("openrlhf"), job_name="orl")
    _s, participants = collector.from_snapshot(snap, time.time())
    trainers = sorted(
        p.rank for p in participants if p.role == "trainer" and p.phase == PHASE_RUNNING
    )
    assert trainers == [0, 1]
    for a in actors:
        ray.kill(a, no_restart=True)


def test_an_unreachable_ray_is_said_and_the_collector_keeps_trying(
    caplog: pytest.LogCaptureFixture,
) -> None:
    address = f"http://127.0.0.1:{free_port()}"
    collector = RayCollector(load_preset("verl"), address=address, interval=0.2, timeout=1)
    with caplog.at_level(logging.WARNING, logger="rlguard.agent.ray"):
        assert collector.poll_once() is False
        assert collector.poll_once() is False
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and address in lines[0]  # said once, not every round
    samples, participants = collector.collect()
    assert participants == []
    assert [(s["name"], s["value"]) for s in samples] == [("ray_collector_up", 0.0)]


def test_restart_role_kills_through_ray_once_per_key_and_refuses_a_dead_actor(
    local_ray: LocalRay, tmp_path: Path
) -> None:
    import ray

    from tests.integration.ray.actors import WorkerDict, vLLMHttpServer

    trainer = WorkerDict.options(name="abcWorkerDict_0:0", max_restarts=3).remote()
    before = actor_pid(trainer)
    args = ("--job", JOB, "--role", "trainer", "--rank", "0", "--preset", "verl", "--ray-job", JOB)
    first = _hook(local_ray, tmp_path, "restart_role", *args, "--idempotency-key", "inc1-restart")
    assert first.returncode == 0, first.stderr
    answer = json.loads(first.stdout)
    assert answer["already"] is False and answer["pid"] == before and answer["num_restarts"] == 0

    def restarted() -> bool:
        listed = RayStateReader(local_ray.dashboard).snapshot().actors
        return any(
            a.name == "abcWorkerDict_0:0" and a.state == "ALIVE" and a.num_restarts == 1
            for a in listed
        )

    wait_for(restarted, 60, "Ray to restart the killed actor")
    after = actor_pid(trainer)
    assert after != before

    again = _hook(local_ray, tmp_path, "restart_role", *args, "--idempotency-key", "inc1-restart")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["already"] is True
    assert actor_pid(trainer) == after  # the second delivery killed nothing
    listed = RayStateReader(local_ray.dashboard).snapshot().actors
    assert [a.num_restarts for a in listed if a.name == "abcWorkerDict_0:0"] == [1]

    gone = vLLMHttpServer.options(name="vllm_server_7_0", max_restarts=0).remote()
    os.kill(actor_pid(gone), signal.SIGKILL)
    wait_for(
        lambda: any(
            a.name == "vllm_server_7_0" and a.state == "DEAD"
            for a in RayStateReader(local_ray.dashboard).snapshot().actors
        ),
        10,
        "the rollout actor to be DEAD",
    )
    refused = _hook(
        local_ray,
        tmp_path,
        "restart_role",
        "--job",
        JOB,
        "--role",
        "rollout",
        "--rank",
        "7",
        "--preset",
        "verl",
        "--ray-job",
        JOB,
        "--idempotency-key",
        "k2",
    )
    assert refused.returncode == 1
    assert "DEAD" in refused.stderr and "restart_job" in refused.stderr
    ray.kill(trainer, no_restart=True)


def test_restart_job_resubmits_through_the_jobs_api_with_verls_resume_flag_once(
    local_ray: LocalRay, tmp_path: Path
) -> None:
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(local_ray.dashboard)
    script = "import sys, time; print('ARGV', sys.argv[1:], flush=True); time.sleep(600)"
    old = client.submit_job(
        entrypoint=f'python -c "{script}" trainer.total_epochs=1 trainer.resume_mode=disable',
        metadata={"rlguard_job": "verl-sub"},
    )
    wait_for(lambda: client.get_job_status(old).value == "RUNNING", 60, "the job to run")
    args = ("--job", "verl-sub", "--preset", "verl", "--idempotency-key", "inc9-restart_job")
    done = _hook(local_ray, tmp_path, "restart_job", *args)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    new = answer["submitted"]
    assert answer["stopped"] == old and answer["already"] is False
    assert answer["released_safe_mode"] is False  # no run directory of the job: nothing held it
    assert client.get_job_status(old).value == "STOPPED"
    info = client.get_job_info(new)
    assert info.metadata == {"rlguard_job": "verl-sub"}
    assert info.entrypoint.endswith("trainer.total_epochs=1 trainer.resume_mode=auto")
    printed = "ARGV ['trainer.total_epochs=1', 'trainer.resume_mode=auto']"
    wait_for(lambda: printed in client.get_job_logs(new), 60, "the job to run with resume=auto")

    again = _hook(local_ray, tmp_path, "restart_job", *args)
    assert again.returncode == 0 and json.loads(again.stdout)["already"] is True
    mine = [j for j in client.list_jobs() if (j.metadata or {}).get("rlguard_job") == "verl-sub"]
    assert len(mine) == 2  # the stopped one and one resubmission, not two
    client.stop_job(new)

    refused = _hook(
        local_ray,
        tmp_path,
        "restart_job",
        "--job",
        "not-submitted",
        "--preset",
        "verl",
        "--idempotency-key",
        "x1",
    )
    assert refused.returncode == 1 and "Jobs API" in refused.stderr

    # A submission whose recorded entrypoint is blank (the Jobs API takes any string): refused,
    # nothing submitted.
    blank = client.submit_job(entrypoint=" ", metadata={"rlguard_job": "blank"})
    wait_for(
        lambda: client.get_job_status(blank).value in ("SUCCEEDED", "FAILED", "STOPPED"),
        60,
        "the blank job to end",
    )
    refused = _hook(
        local_ray,
        tmp_path,
        "restart_job",
        "--job",
        "blank",
        "--preset",
        "verl",
        "--idempotency-key",
        "x2",
    )
    assert refused.returncode == 1 and "no recorded entrypoint" in refused.stderr, refused.stderr
    assert (
        len([j for j in client.list_jobs() if (j.metadata or {}).get("rlguard_job") == "blank"])
        == 1
    )


def test_hook_bad_input_is_one_line_and_exit_2(local_ray: LocalRay, tmp_path: Path) -> None:
    bad = _hook(
        local_ray,
        tmp_path,
        "restart_role",
        "--job",
        JOB,
        "--role",
        "trainer",
        "--rank",
        "0",
        "--preset",
        "nope",
        "--idempotency-key",
        "k",
    )
    assert bad.returncode == 2 and "unknown Ray preset 'nope'" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    norank = _hook(
        local_ray,
        tmp_path,
        "restart_role",
        "--job",
        JOB,
        "--role",
        "trainer",
        "--idempotency-key",
        "k",
    )
    assert norank.returncode == 2 and "--rank" in norank.stderr
    written = tmp_path / "hook"
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "integrations.ray.hook",
            "write-hook",
            str(written),
            "--dashboard",
            local_ray.dashboard,
            "--preset",
            "nope",
            "--state-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env_for_subprocess(),
        check=False,
    )
    assert refused.returncode == 2 and "unknown Ray preset 'nope'" in refused.stderr
    assert not written.exists()
    move = _hook(local_ray, tmp_path, "reschedule_batches", "--job", JOB, "--idempotency-key", "k")
    assert move.returncode == 1 and "not done through Ray" in move.stderr


def test_a_second_raylet_killed_is_a_dead_node_and_its_actors_are_lost(local_ray: LocalRay) -> None:
    from tests.integration.ray.actors import vLLMHttpServer

    # A second node of the same cluster on this machine, in its own process group (ours to kill).
    node = spawn(
        [
            "ray",
            "start",
            "--address",
            local_ray.gcs_address,
            "--num-cpus",
            "1",
            "--resources",
            '{"second_node": 1}',
            "--object-store-memory",
            str(80 * 1024 * 1024),
            "--block",
        ],
        env=env_for_subprocess(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        executable=str(Path(sys.executable).with_name("ray")),
    )
    try:
        reader = RayStateReader(local_ray.dashboard)
        wait_for(
            lambda: len([n for n in reader.snapshot().nodes if n.state == "ALIVE"]) == 2,
            60,
            "the second node to join",
        )
        rollout = vLLMHttpServer.options(
            name="vllm_server_5_0", max_restarts=0, resources={"second_node": 0.01}
        ).remote()
        actor_pid(rollout)
        collector = RayCollector(load_preset("verl"), address=local_ray.dashboard, job_name=JOB)
        os.killpg(node.pid, signal.SIGKILL)
        node.wait(10)

        def lost() -> tuple[list[dict[str, Any]], ParticipantReport] | None:
            collector.poll_once()
            samples, participants = collector.collect()
            dead_nodes = [s for s in samples if s["name"] == "ray_node_alive" and s["value"] == 0]
            p = [p for p in participants if (p.role, p.rank) == ("rollout", 5)]
            return (dead_nodes, p[0]) if dead_nodes and p and p[0].phase == PHASE_DEAD else None

        dead_nodes, participant = wait_for(lost, 30, "the node and its actor reported dead")
        assert [d["labels"] for d in dead_nodes] == [
            {"ray_node": dead_nodes[0]["labels"]["ray_node"], "job": JOB}
        ]
        samples, _p = collector.collect()
        cause = [s for s in samples if s["name"] == "ray_actor_dead" and s["labels"]["rank"] == "5"]
        assert cause[0]["labels"]["reason"] == "NODE_DIED"
    finally:
        if node.poll() is None:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait(10)
