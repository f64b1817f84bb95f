"""A pytest killed with ``kill -9`` leaves no server, agent or worker process running: the
harness starts each in a process group of its own that dies with the run, and what product code
starts for a test in a session of its own (as ``app.cli.demo.DemoStack`` does) carries the run's
token and dies with it too (tests/harness/reaper.py)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from tests.harness import REPO, spawn, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# The test the killed pytest runs: a process started the way product code starts one (a plain
# Popen in a session of its own), a real server and a real Celery worker from the harness; their
# pids written out, it waits to be killed.
INNER = """
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.harness import RLGUARD, ServerProcess, free_port, rlguard_env, run_cli, start_worker


def test_start_a_server_and_a_worker_then_hang(tmp_path: Path) -> None:
    stray = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    env = rlguard_env(f"sqlite:///{tmp_path / 'rlguard.db'}", tmp_path / "data", RLGUARD_DEV="1")
    assert run_cli("db", "upgrade", env=env).returncode == 0
    port = free_port()
    argv = [*RLGUARD, "server", "--host", "127.0.0.1", "--port", str(port)]
    server = ServerProcess(argv, env, port, tmp_path / "server.log").start()
    worker = start_worker("--concurrency", "1", env=env, log=tmp_path / "worker.log")
    assert server.proc is not None
    pids = Path(os.environ["REAPER_TEST_PIDS"])
    pids.with_suffix(".tmp").write_text(f"{server.proc.pid} {worker.pid} {stray.pid}")
    pids.with_suffix(".tmp").rename(pids)  # never read half-written
    time.sleep(600)  # the scenario: this pytest is killed with -9 while its children run
"""


def _pgrp_and_start(pid: int) -> tuple[int, int] | None:
    """(process group, start time) of a live, non-zombie process; None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    if fields[0] == "Z":
        return None
    return int(fields[2]), int(fields[19])


def _members(groups: set[int]) -> set[tuple[int, int]]:
    """(pid, start time) of every live process in ``groups``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = _pgrp_and_start(int(entry.name))
            if st is not None and st[0] in groups:
                found.add((int(entry.name), st[1]))
    return found


def test_kill_9_of_pytest_leaves_no_server_or_worker_running(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    pids_file = tmp_path / "pids"
    env = {**os.environ, "PYTHONPATH": str(REPO), "REAPER_TEST_PIDS": str(pids_file)}
    log = tmp_path / "inner-pytest.log"
    inner = spawn(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-s",
            "-p",
            "tests.conftest",
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_inner.py"),
        ],
        env=env,
        cwd=tmp_path,
        log=log,
    )
    text = wait_for(
        lambda: pids_file.exists() and pids_file.read_text(),
        90,
        "the inner test's server and worker",
        context=lambda: log.read_text(errors="replace")[-3000:],
    )
    groups = {int(pid) for pid in text.split()}

    try:
        # The worker's pool child too: a grandchild of pytest, in the worker's group.
        def all_started() -> set[tuple[int, int]] | None:
            members = _members(groups)
            return members if len(members) >= 4 else None

        children = wait_for(all_started, 60, "the stray, the server, the worker and its pool child")

        os.kill(inner.pid, signal.SIGKILL)
        inner.wait(10)

        left = wait_for(
            lambda: not _members(groups) and ["gone"],
            30,
            f"every child of the killed pytest to be gone ({sorted(children)})",
            context=lambda: f"still running: {sorted(_members(groups))}",
        )
        assert left == ["gone"]
    finally:  # a failure here must not leave them running either
        for pgid in groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
