"""A job may run one launcher per role in its run directory (a TRL trainer under one
``rlguard launch``, its vLLM engine under another): a request for a role is left to the launcher
that runs it, one launcher stopping does not silence the other, and a lone launcher still
answers a request for a role nobody runs (nothing waits for a launcher that will never come)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from recovery.supervision import requests


@pytest.fixture
def other_launcher(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A live process standing for the engine's launcher, announced with role ``rollout``."""
    proc = subprocess.Popen(["sleep", "60"])
    directory = requests.launchers_dir(tmp_path)
    directory.mkdir(parents=True)
    body = {"pid": proc.pid, "started_at": 0.0, "roles": ["rollout"]}
    (directory / f"{proc.pid}.json").write_text(json.dumps(body))
    yield proc
    proc.kill()
    proc.wait(10)


def test_a_request_for_the_other_launchers_role_is_left_to_it(
    tmp_path: Path, other_launcher: subprocess.Popen[bytes]
) -> None:
    requests.announce(tmp_path, job="j", roles=["trainer"])  # this process: the trainer's
    restart = {"action": "restart_role", "role": "rollout", "rank": "0"}
    assert requests.for_another_launcher(tmp_path, restart, runs_it=False)
    stacks = {"action": "capture_stacks", "role": "rollout", "rank": "0"}
    assert requests.for_another_launcher(tmp_path, stacks, runs_it=False)
    # Its own role, a role nobody runs, and a job-wide action: this launcher answers.
    mine = {"action": "restart_role", "role": "trainer", "rank": "0"}
    assert not requests.for_another_launcher(tmp_path, mine, runs_it=True)
    nobody = {"action": "restart_role", "role": "critic", "rank": "0"}
    assert not requests.for_another_launcher(tmp_path, nobody, runs_it=False)
    assert not requests.for_another_launcher(tmp_path, {"action": "restart_job"}, runs_it=False)


def test_one_launcher_stopping_leaves_the_other_reachable(
    tmp_path: Path, other_launcher: subprocess.Popen[bytes]
) -> None:
    requests.announce(tmp_path, job="j", roles=["trainer"])
    assert len(requests.live_launchers(tmp_path)) == 2
    requests.retire(tmp_path)  # the trainer's launcher is done
    [left] = requests.live_launchers(tmp_path)
    assert left["roles"] == ["rollout"] and requests._launcher_alive(tmp_path)


def test_a_dead_launchers_roles_are_nobodys(
    tmp_path: Path, other_launcher: subprocess.Popen[bytes]
) -> None:
    requests.announce(tmp_path, job="j", roles=["trainer"])
    other_launcher.kill()
    other_launcher.wait(10)
    restart = {"action": "restart_role", "role": "rollout", "rank": "0"}
    assert not requests.for_another_launcher(tmp_path, restart, runs_it=False)
    requests.retire(tmp_path)
    assert not requests._launcher_alive(tmp_path)  # the hook refuses at once
