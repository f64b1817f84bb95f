"""``rlguard launch --first-step-budget``: refused when not a positive number (nothing
started), declared for each process it starts (its pid), replaced at a restart."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from integrations.launch import main as launch_main
from tests.unit.integrations._launcher import SCRIPT, Launch

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("0", "--first-step-budget must be a positive number of seconds, got '0'"),
        ("-5", "--first-step-budget must be >= 0, got '-5'"),
        ("soon", "--first-step-budget must be a number, got 'soon'"),
        ("inf", "--first-step-budget must be a positive number of seconds, got 'inf'"),
    ],
)
def test_a_bad_budget_is_refused_naming_it(
    tmp_path: Path, value: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        launch_main(
            [
                "--run-dir",
                str(run_dir),
                "--role",
                "trainer",
                "--first-step-budget",
                value,
                "--",
                "python",
                str(SCRIPT),
            ]
        )
    err = capsys.readouterr().err
    assert exc.value.code == 2 and needle in err and err.count("\n") == 1, err
    assert not run_dir.exists()


@pytest.fixture
def launches() -> Iterator[list[Launch]]:
    started: list[Launch] = []
    yield started
    for launch in started:
        launch.close()


def test_each_start_declares_its_budget_for_its_pid(tmp_path: Path, launches: list[Launch]) -> None:
    run_dir = tmp_path / "job"
    launch = Launch(run_dir, "--role", "trainer", "--first-step-budget", "75", "--backoff", "0")
    launches.append(launch)
    launch.wait(lambda: launch.beat().get("phase") == "TRAIN", "the script to train")
    path = run_dir / "launch" / "trainer-0.json"
    first = json.loads(path.read_text())
    assert first == {"pid": launch.beat()["pid"], "first_step_budget_seconds": 75.0}
    launch.kill_child()
    launch.wait(lambda: launch.events("child_exit"), "the exit")
    answer = launch.hook("restart_role", "--role", "trainer", "--rank", "0", key="k/r")
    assert answer.returncode == 0, answer.stderr
    launch.wait(lambda: json.loads(path.read_text())["pid"] != first["pid"], "a new declaration")
    assert json.loads(path.read_text())["pid"] == launch.events("spawn")[-1]["child_pid"]
