"""``rlguard launch`` reads why a process failed in its own output: real launcher, real child
processes that fail as real training scripts do (PyTorch's CUDA OOM exception and text, the NCCL
watchdog's line and abort, a SIGKILL with no output), the cause written into the heartbeat with
the exit, redacted; a bad catalogue refused before anything starts."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from integrations.launch import main as launch_main
from tests.unit.integrations._launcher import HERE, Launch, env

pytestmark = pytest.mark.timeout(120)
FAILING = HERE / "_failing_script.py"
TOKEN = "hf_TestTokenValue0123456789abcdef"


@pytest.fixture
def launches() -> Iterator[list[Launch]]:
    started: list[Launch] = []
    yield started
    for launch in started:
        launch.close()


def _run(launches: list[Launch], tmp_path: Path, *script_args: str, name: str = "job") -> Launch:
    launch = Launch(
        tmp_path / name,
        "--role",
        "trainer",
        "--backoff",
        "0",
        script=FAILING,
        script_args=script_args,
        environ=env(HF_TOKEN=TOKEN),
    )
    launches.append(launch)
    return launch


def _exited(launch: Launch) -> dict[str, object]:
    launch.wait(lambda: launch.events("child_exit"), "the launcher to see the exit")
    beat = launch.beat()
    assert beat["phase"] in ("EXITED", "DONE"), beat
    return beat


def test_a_cuda_oom_is_the_cause_with_pytorchs_line(tmp_path: Path, launches: list[Launch]) -> None:
    launch = _run(launches, tmp_path, "--fail", "oom", "--print-secret")
    beat = _exited(launch)
    cause = beat["exit_cause"]
    assert beat["exit_code"] == 1 and beat["phase"] == "EXITED"
    assert cause["cause"] == "cuda_oom" and cause["kind"] == "cuda_oom", cause
    assert cause["line"].startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate")
    assert len(cause["line"]) <= 120 and "PyTorch" in cause["source"]
    [event] = launch.events("child_exit")
    assert event["cause"] == "cuda_oom" and event["line"] == cause["line"]
    # The token the script printed into its fatal message is not in what leaves the launcher.
    assert TOKEN in (tmp_path / "job" / "logs" / "trainer-0.log").read_text()
    assert TOKEN not in json.dumps(beat) and TOKEN not in json.dumps(launch.events())


def test_the_nccl_watchdog_line_is_a_collective_timeout(
    tmp_path: Path, launches: list[Launch]
) -> None:
    beat = _exited(_run(launches, tmp_path, "--fail", "nccl"))
    assert beat["exit_signal"] == "SIGABRT"
    assert beat["exit_cause"]["cause"] == "collective_timeout"
    assert "Watchdog caught collective operation timeout" in beat["exit_cause"]["line"]


def test_a_sigkill_with_no_output_has_no_cause(tmp_path: Path, launches: list[Launch]) -> None:
    beat = _exited(_run(launches, tmp_path, "--fail", "sigkill"))
    assert beat["exit_signal"] == "SIGKILL" and beat["phase"] == "EXITED"
    assert "exit_cause" not in beat
    assert launch_cause(tmp_path) is None


def launch_cause(tmp_path: Path) -> object:
    events = [json.loads(x) for x in (tmp_path / "job" / "events.jsonl").read_text().splitlines()]
    return next(e for e in events if e["kind"] == "child_exit")["cause"]


def test_a_clean_exit_after_a_caught_oom_has_no_cause(
    tmp_path: Path, launches: list[Launch]
) -> None:
    launch = _run(launches, tmp_path, "--fail", "caught-oom")
    assert launch.proc.wait(60) == 0, launch.logs()
    beat = launch.beat()
    assert beat["phase"] == "DONE" and "exit_cause" not in beat
    assert "CUDA out of memory" in (tmp_path / "job" / "logs" / "trainer-0.log").read_text()


def test_an_earlier_starts_output_is_not_the_cause_of_a_later_exit(
    tmp_path: Path, launches: list[Launch]
) -> None:
    """The first start dies of an OOM; restarted, the script (given no --fail on resume by the
    generic integration, the same argv) dies again, and what counts is only what this start
    printed: the log file holds both, the tail starts at this start's output."""
    run = tmp_path / "job"
    launch = _run(launches, tmp_path, "--fail", "oom")
    assert _exited(launch)["exit_cause"]["cause"] == "cuda_oom"
    # The next start is killed by SIGKILL before it prints anything: no cause, though the log
    # file's tail (the previous start's traceback) still says OOM.
    (run / "logs" / "trainer-0.log").open("a").close()
    answer = launch.hook("restart_role", "--role", "trainer", "--rank", "0", key="k/restart")
    assert answer.returncode == 0, answer.stderr
    launch.wait(lambda: len(launch.events("spawn")) == 2, "the restart")
    pid = launch.wait(
        lambda: launch.beat().get("phase") == "TRAIN" and launch.beat()["pid"],
        "the second start to train",
    )
    os.kill(int(pid), 9)
    launch.wait(lambda: len(launch.events("child_exit")) == 2, "the second exit")
    beat = launch.beat()
    assert beat["exit_signal"] == "SIGKILL" and "exit_cause" not in beat, beat
    assert "CUDA out of memory" in (run / "logs" / "trainer-0.log").read_text()


def test_a_cause_is_found_after_100_mb_of_output(tmp_path: Path, launches: list[Launch]) -> None:
    beat = _exited(_run(launches, tmp_path, "--fail", "oom", "--noise", str(100 * 1024 * 1024)))
    assert beat["exit_cause"]["cause"] == "cuda_oom"
    assert (tmp_path / "job" / "logs" / "trainer-0.log").stat().st_size > 100 * 1024 * 1024


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        (
            "  - {cause: x, pattern: 'a(b', kind: cuda_oom, tier: medium, plan: [], source: s}",
            "line 2: pattern 'a(b' of 'x' is not valid",
        ),
        (
            "  - {cause: x, pattern: 'a', kind: cuda_oops, tier: medium, plan: [], source: s}",
            "line 2: unknown kind 'cuda_oops' for cause 'x'",
        ),
        (
            "  - {cause: x, pattern: 'a', kind: cuda_oom, tier: severe, plan: [], source: s}",
            "line 2: tier 'severe' must be one of light, medium, heavy",
        ),
        (
            "  - {cause: x, pattern: 'a', kind: cuda_oom, tier: light, plan: [], source: s, why: y}",
            "line 2: unknown field 'why'",
        ),
        (
            "  - {cause: x, pattern: 'a', kind: cuda_oom, tier: light, plan: []}",
            "line 2: missing 'source'",
        ),
    ],
)
def test_a_bad_catalogue_is_refused_naming_its_line_and_nothing_starts(
    tmp_path: Path, row: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "causes.yaml"
    bad.write_text("causes:\n" + row + "\n")
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        launch_main(
            [
                "--run-dir",
                str(run_dir),
                "--role",
                "trainer",
                "--exit-causes",
                str(bad),
                "--",
                "python",
                str(FAILING),
            ]
        )
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"rlguard launch: error: --exit-causes: exit-cause catalogue {bad}, "), (
        err
    )
    assert needle in err, err
    assert not run_dir.exists()
