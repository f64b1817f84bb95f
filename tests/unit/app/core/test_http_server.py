"""The shutdown deadline of app.core.http_server, in a process of its own (it ends that
process): armed by the first exit signal, it exits with status 1 after the deadline, writing
every thread's stack to stderr, or without a stderr to write to, silently."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]

SCRIPT = """
import signal, sys, time
import uvicorn
from app.core.http_server import _DeadlineServer
server = _DeadlineServer(uvicorn.Config("app.main:create_app_from_env"), {deadline})
if {no_stderr}:
    sys.stderr = None
server.handle_exit(signal.SIGTERM, None)
server.handle_exit(signal.SIGTERM, None)  # a second signal does not re-arm it
assert server.should_exit
time.sleep(30)  # a shutdown that never ends
"""


@pytest.mark.parametrize("no_stderr", [False, True])
def test_the_first_exit_signal_arms_a_deadline_that_ends_the_process(no_stderr: bool) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(deadline=1.0, no_stderr=no_stderr)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=25,
    )
    took = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    assert took < 20  # the sleep was cut short (the interpreter's start-up counts too)
    if no_stderr:
        assert "Timeout" not in done.stderr
    else:
        assert "Timeout (0:00:01)!" in done.stderr and "in <module>" in done.stderr
