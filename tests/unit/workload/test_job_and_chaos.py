from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from workload.chaos import (
    ChaosError,
    Fault,
    inject,
    make_checkpoints_unwritable,
    restore_checkpoints,
)
from workload.file_lease import FileLease
from workload.job import JobConfig, JobConfigError, RunDir, read_events
from workload.launch import main as launch_main
from workload.rollout import _starved


@pytest.mark.parametrize(
    ("field", "value"), [("steps", 0), ("rollouts", 0), ("decode_ms_per_token", -1.0), ("lr", 0.0)]
)
def test_job_config_refuses_bad_values_naming_them(field: str, value: object) -> None:
    with pytest.raises(JobConfigError, match=field):
        JobConfig(**{"job": "j", "steps": 3, field: value})  # type: ignore[arg-type]


def test_job_config_round_trips_through_json() -> None:
    cfg = JobConfig(job="j", steps=5, rollouts=3)
    assert JobConfig.from_json(json.loads(json.dumps(cfg.to_json()))) == cfg


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"fault": "meteor"}, "meteor"),
        ({"fault": "kill", "role": "judge"}, "judge"),
        ({"fault": "kill", "rank": -1}, "rank"),
        ({"fault": "kill", "colour": 1}, "colour"),
        ({"fault": "slow-statelog", "ms": 0}, "ms"),
        ("kill", "object"),
    ],
)
def test_bad_scheduled_faults_are_refused(body: object, needle: str) -> None:
    with pytest.raises(ChaosError, match=needle):
        Fault.from_json(body)


def test_kill_without_a_running_job_names_the_missing_process(tmp_path: Path) -> None:
    with pytest.raises(ChaosError, match="rollout-1"):
        inject(RunDir(tmp_path), Fault("kill", role="rollout", rank=1))
    assert read_events(RunDir(tmp_path)) == []  # nothing recorded for a fault that did not happen


def test_simulated_gpu_faults_become_agent_fault_files(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    inject(run, Fault("xid", gpu=1, xid=79))
    inject(run, Fault("ecc", gpu=0))
    bodies = sorted(
        json.loads(p.read_text())["fault"] for p in (tmp_path / "rlguard-simulate").glob("*.json")
    )
    assert bodies == ["ecc_uncorrectable", "xid"]
    assert [e["fault"] for e in read_events(run)] == ["xid", "ecc"]


def test_starve_starves_the_rollouts_started_before_it_not_their_successors(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    before = time.time()
    assert not _starved(run, before)  # nothing injected
    info = inject(run, Fault("starve"))
    assert info["role"] == "rollout" and info["at"] >= before
    assert _starved(run, before)  # a worker started before the injection generates nothing
    assert not _starved(run, info["at"] + 1.0)  # a restarted one does
    assert [e["fault"] for e in read_events(run)] == ["starve"]


def test_unwritable_checkpoints_and_back(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    run.checkpoints.mkdir()
    (run.checkpoints / "ckpt-0000000001").mkdir()
    make_checkpoints_unwritable(run)
    with pytest.raises(OSError):
        (run.checkpoints / "new").mkdir()
    with pytest.raises(ChaosError, match="already held"):
        make_checkpoints_unwritable(run)
    restore_checkpoints(run)
    assert (run.checkpoints / "ckpt-0000000001").is_dir()
    with pytest.raises(ChaosError, match="nothing to restore"):
        restore_checkpoints(run)


def test_file_lease_excludes_a_second_holder_until_expiry(tmp_path: Path) -> None:
    a = FileLease(tmp_path / "l", ttl=0.5)
    grant = a.try_acquire("a")
    assert grant is not None and grant.epoch == 1
    assert a.try_acquire("b") is None and a.current_holder() == "a"
    assert a.publish("a", {"v": 1}) and not a.publish("b", {"v": 2})
    assert a.read_state() == {"v": 1}
    time.sleep(0.6)  # the scenario: the 0.5 s lease runs out
    assert not a.renew("a")
    second = a.try_acquire("b")
    assert second is not None and second.epoch == 2
    with pytest.raises(ValueError, match="ttl"):
        FileLease(tmp_path / "x", ttl=0)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (
            ["hook", "explode", "--job", "j", "--idempotency-key", "k", "--run-root", "/tmp"],
            "explode",
        ),
        (
            [
                "hook",
                "restart_role",
                "--job",
                "../etc",
                "--idempotency-key",
                "k",
                "--run-root",
                "/tmp",
            ],
            "../etc",
        ),
        (
            [
                "hook",
                "restart_role",
                "--job",
                "j",
                "--idempotency-key",
                "a b",
                "--run-root",
                "/tmp",
            ],
            "a b",
        ),
        (
            [
                "hook",
                "restart_role",
                "--job",
                "j",
                "--rank",
                "x",
                "--idempotency-key",
                "k",
                "--run-root",
                "/tmp",
            ],
            "'x'",
        ),
        (
            [
                "hook",
                "restart_role",
                "--job",
                "j",
                "--role",
                "ro-le",
                "--idempotency-key",
                "k",
                "--run-root",
                "/tmp",
            ],
            "ro-le",
        ),
        (["--run-dir", "/tmp/x", "--steps", "0"], "steps"),
        (["--run-dir", "/tmp/x", "--steps", "3", "--group-size", "1"], "group-size"),
        (
            ["--run-dir", "/tmp/x", "--steps", "3", "--on-failure", "restart-job", "--standby"],
            "--standby",
        ),
    ],
)
def test_launcher_refuses_bad_arguments_naming_them(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        launch_main(argv)
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


def test_hook_without_a_running_job_fails_clearly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = launch_main(
        [
            "hook",
            "restart_role",
            "--job",
            "j",
            "--role",
            "rollout",
            "--idempotency-key",
            "inc1/s0/restart_role:j",
            "--run-root",
            str(tmp_path),
        ]
    )
    assert code == 2 and "no running job 'j'" in capsys.readouterr().err
    assert not (tmp_path / "j").exists()
