"""An engine's API server dies with its host, however the host dies (kill -9 of a standby whose
engine is still starting): it runs in a session of its own, out of reach of its launcher's
group signals, so the kernel's parent-death signal is what ends it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.harness import wait_for
from workload.engines.records import _running

pytestmark = pytest.mark.timeout(60)

HOST = (
    "import sys, time\n"
    "from integrations.vllm.server import popen_dying_with_parent\n"
    "p = popen_dying_with_parent(['sleep', '60'], start_new_session=True)\n"
    "print(p.pid, flush=True)\n"
    "time.sleep(60)\n"
)


def test_the_engine_process_is_killed_when_its_host_is_killed() -> None:
    host = subprocess.Popen([sys.executable, "-c", HOST], stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout is not None
        engine = int(host.stdout.readline())
        assert _running(engine) and os.getsid(engine) != os.getsid(host.pid)
        os.kill(host.pid, signal.SIGKILL)
        host.wait(10)
        wait_for(lambda: not _running(engine), 10, "the engine to die with its host")
    finally:
        if host.poll() is None:
            host.kill()
