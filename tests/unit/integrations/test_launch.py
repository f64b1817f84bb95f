"""``rlguard launch`` on a plain Python script: bad input, exits written into heartbeats at once,
restarts through the launcher hook with the integration's resume arguments, the restart budget,
SAFE_MODE, --nproc and a warm standby. Real processes throughout (the launcher, the script, the
hook); the script uses nothing but the heartbeat API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from integrations.launch import main as launch_main
from recovery.control import ControlMode, write_control
from tests.unit.integrations._launcher import ROOT, SCRIPT, TEST_INTEGRATION, Launch, env

pytestmark = pytest.mark.timeout(90)
PY = sys.executable


@pytest.fixture
def launches() -> Iterator[list[Launch]]:
    started: list[Launch] = []
    yield started
    for launch in started:
        launch.close()


def _start(launches: list[Launch], run_dir: Path, *args: str, **kw: object) -> Launch:
    launch = Launch(run_dir, *args, **kw)  # type: ignore[arg-type]
    launches.append(launch)
    return launch


# ---- bad input: one line naming the bad value, exit code 2, nothing started ---------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--role", "trainer"], "no command to run: put it after --"),
        (["--role", "trainer", "--"], "no command to run"),
        (
            ["--role", "trainer", "--", "no-such-program-xyz"],
            "command 'no-such-program-xyz' not found",
        ),
        (["--role", "train-er", "--", PY, str(SCRIPT)], "--role 'train-er'"),
        (["--role", "", "--", PY, str(SCRIPT)], "--role ''"),
        (
            ["--role", "trainer", "--rank", "-1", "--", PY, str(SCRIPT)],
            "--rank must be a non-negative integer, got '-1'",
        ),
        (["--role", "trainer", "--rank", "x", "--", PY, str(SCRIPT)], "got 'x'"),
        (
            ["--role", "trainer", "--nproc", "0", "--", PY, str(SCRIPT)],
            "--nproc must be between 1 and 256, got '0'",
        ),
        (
            ["--role", "trainer", "--rank", "0", "--nproc", "2", "--", PY, str(SCRIPT)],
            "not allowed with argument",
        ),
        (["--role", "trainer", "--job", "a/b", "--", PY, str(SCRIPT)], "--job 'a/b'"),
        (
            ["--role", "trainer", "--integration", "nope", "--", PY, str(SCRIPT)],
            "unknown integration 'nope' (known: none, trl",
        ),
        (
            ["--role", "trainer", "--integration", "no_such.module", "--", PY, str(SCRIPT)],
            "cannot import integration module 'no_such.module'",
        ),
        (
            ["--role", "trainer", "--backend", "pbs", "--", PY, str(SCRIPT)],
            "unknown backend 'pbs' (known: local",
        ),
        (
            ["--role", "trainer", "--max-restarts", "-2", "--", PY, str(SCRIPT)],
            "--max-restarts must be >= 0, got '-2'",
        ),
        (
            ["--role", "trainer", "--backoff", "5", "--backoff-max", "1", "--", PY, str(SCRIPT)],
            "backoff_max (1) must be >= backoff (5)",
        ),
        (
            ["--role", "trainer", "--standby", "--", "sh", "-c", "true"],
            "--standby: a standby runs Python scripts",
        ),
        (
            ["--role", "trainer", "--preload", "torch", "--", PY, str(SCRIPT)],
            "--preload is for --standby",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_started(
    tmp_path: Path, args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        launch_main(["--run-dir", str(run_dir), *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert needle in err, err
    assert err.count("\n") == 1 and err.startswith("rlguard launch: error: "), err
    assert not run_dir.exists()


def test_an_unwritable_run_dir_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(SystemExit) as exc:
        launch_main(["--run-dir", str(blocker / "run"), "--role", "trainer", "--", PY, str(SCRIPT)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1
    assert f"--run-dir {str(blocker / 'run')!r} is not a writable directory" in err


def test_a_failing_integration_check_refuses_through_the_real_cli(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [
            str(Path(PY).parent / "rlguard"),
            "launch",
            "--run-dir",
            str(run_dir),
            "--role",
            "trainer",
            "--integration",
            TEST_INTEGRATION,
            "--",
            PY,
            str(SCRIPT),
        ],
        cwd=ROOT,
        env=env(RLGUARD_TEST_INTEGRATION_BROKEN="1"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr == (
        f"rlguard launch: error: --integration {TEST_INTEGRATION}: "
        "test framework 0.1 is not supported (need >= 1.0)\n"
    )
    assert not run_dir.exists()


# ---- the launcher at work --------------------------------------------------------------------


def test_kill_9_is_in_the_heartbeat_at_once_and_the_hook_restarts_with_resume_arguments(
    tmp_path: Path, launches: list[Launch]
) -> None:
    run_dir = tmp_path / "job-a"
    launch = _start(
        launches,
        run_dir,
        "--role",
        "trainer",
        "--integration",
        TEST_INTEGRATION,
        script_args=("--lr", "0.1"),
    )
    launch.wait(lambda: launch.beat().get("phase") == "TRAIN", "the script to train")
    dead = launch.kill_child()
    exit_event = launch.wait(lambda: launch.events("child_exit"), "the launcher to see the exit")[0]
    beat = launch.beat()
    # The heartbeat said EXITED (with the signal) before the exit went on the timeline.
    assert beat["phase"] == "EXITED" and beat["pid"] == dead, beat
    assert beat["exit_code"] == -9 and beat["exit_signal"] == "SIGKILL"
    assert beat["ts"] <= exit_event["ts"]
    assert exit_event["code"] == -9
    # Nothing restarts by itself: RLGuard decides.
    assert len(launch.events("spawn")) == 1

    answer = launch.hook(
        "restart_role", "--role", "trainer", "--rank", "0", key="inc1/restart_role"
    )
    assert answer.returncode == 0, answer.stderr
    body = json.loads(answer.stdout)
    assert body["ok"] is True and body["restarted"] == ["trainer-0"]
    starts = launch.wait(lambda: len(launch.starts()) == 2 and launch.starts(), "the restart")
    assert starts[0]["argv"] == ["--lr", "0.1"]
    assert starts[1]["argv"] == ["--lr", "0.1", "--resumed-from", "1"]
    launch.wait(
        lambda: (
            launch.beat().get("pid") == starts[1]["pid"] and launch.beat().get("phase") == "TRAIN"
        ),
        "the restarted script to report",
    )
    # The same key again is answered again without a second restart.
    again = launch.hook("restart_role", "--role", "trainer", "--rank", "0", key="inc1/restart_role")
    assert again.returncode == 0 and json.loads(again.stdout)["restarted"] == ["trainer-0"]
    assert len(launch.events("spawn")) == 2

    (run_dir / "stop").touch()
    assert launch.proc.wait(30) == 0, launch.logs()
    assert launch.beat()["phase"] == "DONE"
    assert not list((run_dir / "recovery" / "launchers").glob("*.json"))  # retired


def test_an_empty_restart_budget_refuses_clearly(tmp_path: Path, launches: list[Launch]) -> None:
    run_dir = tmp_path / "job-b"
    launch = _start(launches, run_dir, "--role", "trainer", "--max-restarts", "1", "--backoff", "0")
    launch.wait(lambda: launch.beat().get("phase") == "TRAIN", "the script to train")
    launch.kill_child()
    launch.wait(lambda: launch.beat().get("phase") == "EXITED", "the exit")
    assert launch.hook("restart_role", "--role", "trainer", key="k1").returncode == 0
    launch.wait(
        lambda: (
            len(launch.starts()) == 2
            and launch.beat().get("pid") == launch.starts()[1]["pid"]
            and launch.beat().get("phase") == "TRAIN"
        ),
        "the first restart",
    )
    launch.kill_child()
    launch.wait(lambda: launch.beat().get("phase") == "EXITED", "the second exit")
    refused = launch.hook("restart_role", "--role", "trainer", key="k2")
    assert refused.returncode == 1
    body = json.loads(refused.stdout)
    assert body["ok"] is False
    assert body["error"].startswith("restart budget spent: 1 of 1 restarts used (--max-restarts)")
    assert "restart budget spent" in launch.stderr_path.read_text()
    assert len(launch.events("spawn")) == 2 and launch.events("restart_refused")


def test_no_restart_while_safe_mode_until_released(tmp_path: Path, launches: list[Launch]) -> None:
    run_dir = tmp_path / "job-c"
    launch = _start(launches, run_dir, "--role", "trainer")
    launch.wait(lambda: launch.beat().get("phase") == "TRAIN", "the script to train")
    write_control(run_dir, ControlMode.SAFE_MODE, "heavy incident 7")
    launch.kill_child()
    launch.wait(lambda: launch.beat().get("phase") == "EXITED", "the exit")
    held = launch.hook("restart_role", "--role", "trainer", key="k-safe", wait=1.0)
    assert held.returncode == 3 and "did not answer within 1s" in held.stderr
    held_event = launch.wait(lambda: launch.events("restart_held"), "the hold on the timeline")[0]
    assert "SAFE_MODE (heavy incident 7)" in held_event["why"]
    assert len(launch.events("spawn")) == 1 and len(launch.starts()) == 1
    write_control(run_dir, ControlMode.RUN, "approved by alice")
    # The worker retries its hook with the same key: the held request is carried out now.
    released = launch.hook("restart_role", "--role", "trainer", key="k-safe")
    assert released.returncode == 0, released.stderr
    assert json.loads(released.stdout)["restarted"] == ["trainer-0"]
    launch.wait(lambda: len(launch.starts()) == 2, "the restart after the release")


def test_nproc_starts_each_rank_with_its_environment(
    tmp_path: Path, launches: list[Launch]
) -> None:
    run_dir = tmp_path / "job-d"
    launch = _start(
        launches,
        run_dir,
        "--role",
        "trainer",
        "--nproc",
        "2",
        "--job",
        "grpo-d",
        script_args=("--steps", "3"),
    )
    assert launch.proc.wait(30) == 0, launch.logs()
    seen = [launch.starts(rank)[0]["env"] for rank in (0, 1)]
    for rank, e in enumerate(seen):
        assert {
            k: e[k]
            for k in (
                "RLGUARD_JOB",
                "RLGUARD_ROLE",
                "RLGUARD_RUN_DIR",
                "RANK",
                "LOCAL_RANK",
                "WORLD_SIZE",
                "MASTER_ADDR",
            )
        } == {
            "RLGUARD_JOB": "grpo-d",
            "RLGUARD_ROLE": "trainer",
            "RLGUARD_RUN_DIR": str(run_dir),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
        }
    assert seen[0]["MASTER_PORT"] == seen[1]["MASTER_PORT"] and int(seen[0]["MASTER_PORT"]) > 0
    assert [launch.beat(rank=r)["phase"] for r in (0, 1)] == ["DONE", "DONE"]


def test_a_world_of_one_gets_a_rendezvous_as_under_torchrun(
    tmp_path: Path, launches: list[Launch]
) -> None:
    launch = _start(launches, tmp_path / "job-g", "--role", "trainer", script_args=("--steps", "1"))
    assert launch.proc.wait(30) == 0, launch.logs()
    seen = launch.starts()[0]["env"]
    assert (seen["RANK"], seen["LOCAL_RANK"], seen["WORLD_SIZE"], seen["MASTER_ADDR"]) == (
        "0",
        "0",
        "1",
        "127.0.0.1",
    )
    assert int(seen["MASTER_PORT"]) > 0


def test_one_rank_of_a_larger_world_keeps_its_starters_rendezvous(
    tmp_path: Path, launches: list[Launch]
) -> None:
    run_dir = tmp_path / "job-e"
    launch = _start(
        launches,
        run_dir,
        "--role",
        "trainer",
        "--rank",
        "3",
        script_args=("--steps", "1"),
        environ=env(WORLD_SIZE="8"),
    )
    assert launch.proc.wait(30) == 0, launch.logs()
    seen = json.loads((run_dir / "starts-3.jsonl").read_text())["env"]
    assert (seen["RANK"], seen["LOCAL_RANK"], seen["WORLD_SIZE"], seen["MASTER_PORT"]) == (
        "3",
        "3",
        "8",
        None,
    )


def test_a_warm_standby_becomes_the_restarted_process(
    tmp_path: Path, launches: list[Launch]
) -> None:
    run_dir = tmp_path / "job-f"
    launch = _start(
        launches, run_dir, "--role", "trainer", "--standby", "--integration", TEST_INTEGRATION
    )
    launch.wait(lambda: launch.beat().get("phase") == "TRAIN", "the script to train")
    ready = launch.wait(lambda: launch.events("standby_ready"), "the standby to be ready")[0]
    assert ready["role"] == "trainer" and ready["preload"] == "json"  # the integration's modules
    standby_pid = launch.events("standby_start")[0]["child_pid"]
    launch.kill_child()
    launch.wait(lambda: launch.beat().get("phase") == "EXITED", "the exit")
    assert launch.hook("restart_role", "--role", "trainer", key="k-warm").returncode == 0
    spawn = launch.wait(lambda: launch.events("spawn")[1:], "the restart")[0]
    assert spawn["warm"] is True and spawn["child_pid"] == standby_pid
    started = launch.wait(lambda: launch.starts()[1:], "the standby to run the script")[0]
    # In-process (runpy): the standby's own pid, the resume arguments, the rank's environment.
    assert started["pid"] == standby_pid
    assert started["argv"] == ["--resumed-from", "1"]
    assert started["env"]["RANK"] == "0" and started["env"]["RLGUARD_RUN_DIR"] == str(run_dir)
    launch.wait(
        lambda: launch.beat().get("pid") == standby_pid and launch.beat().get("phase") == "TRAIN",
        "the warm process to report",
    )
    (run_dir / "stop").touch()
    assert launch.proc.wait(30) == 0, launch.logs()
    assert "trainer-0.log" in os.listdir(run_dir / "logs")
