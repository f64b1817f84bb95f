"""Warm standbys: the order a standby takes from the launcher, and what it does with it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workload.job import JobConfig, RunDir, read_events
from workload.job_supervisor import Supervisor
from workload.standby import OrderError, parse_order

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.timeout(120)


def test_a_good_order_gives_the_roles_arguments_and_log() -> None:
    line = json.dumps({"argv": ["--run-dir", "/r", "--rank", "1"], "log": "/r/logs/rollout-1.log"})
    assert parse_order(line + "\n") == (["--run-dir", "/r", "--rank", "1"], "/r/logs/rollout-1.log")


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "an object with argv and log"),
        (json.dumps({"argv": []}), "an object with argv and log"),
        (json.dumps({"argv": [], "log": "x", "extra": 1}), "an object with argv and log"),
        (json.dumps({"argv": "--rank 1", "log": "x"}), "argv must be a list of strings"),
        (json.dumps({"argv": ["--rank", 1], "log": "x"}), "argv must be a list of strings"),
        (json.dumps({"argv": [], "log": ""}), "log must be a file path"),
        (json.dumps({"argv": [], "log": None}), "log must be a file path"),
    ],
)
def test_a_bad_order_is_refused_naming_the_problem(line: str, needle: str) -> None:
    with pytest.raises(OrderError, match=needle):
        parse_order(line)


def _standby(tmp_path: Path, stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "workload.standby", "--role", "rollout", "--run-dir", str(tmp_path)],
        input=stdin,
        capture_output=True,
        cwd=ROOT,
        timeout=100,
        check=False,
    )


def test_a_standby_becomes_the_role_it_is_ordered_to_be(tmp_path: Path) -> None:
    log = tmp_path / "rollout-1.log"
    order = json.dumps({"argv": ["--run-dir", str(tmp_path), "--rank", "-1"], "log": str(log)})
    done = _standby(tmp_path, order.encode() + b"\n")
    # It ran the rollout's own main (which refuses rank -1), writing to the role's log.
    assert done.returncode == 2
    assert "--rank must be >= 0, got -1" in log.read_text()
    assert [e["role"] for e in read_events(RunDir(tmp_path)) if e["kind"] == "standby_ready"] == [
        "rollout"
    ]


def test_a_standby_with_a_bad_order_runs_nothing_and_without_one_just_ends(tmp_path: Path) -> None:
    done = _standby(tmp_path, b'{"argv": "--rank 1", "log": "x"}\n')
    assert done.returncode == 2 and b"argv must be a list of strings" in done.stderr
    assert not (tmp_path / "x").exists()
    assert _standby(tmp_path, b"").returncode == 0


def test_standbys_are_only_for_role_local_restarts(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="standby processes are for on_failure='wait'"):
        Supervisor(
            RunDir(tmp_path), JobConfig(job="j", steps=2), on_failure="restart-job", standby=True
        )
