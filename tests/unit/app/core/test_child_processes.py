from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from app.core.child_processes import ChildSpec, ChildSupervisor


@pytest.mark.timeout(60)
def test_a_dying_child_is_restarted_and_all_are_stopped(tmp_path: Path) -> None:
    marker = tmp_path / "starts"
    crasher = ChildSpec(
        "crasher",
        [sys.executable, "-c", f"open({str(marker)!r}, 'a').write('x'); raise SystemExit(3)"],
    )
    sleeper = ChildSpec("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"])
    sup = ChildSupervisor([crasher, sleeper], poll_interval=0.1)
    sup.start()
    try:
        deadline = time.monotonic() + 20
        while not marker.exists() or len(marker.read_text()) < 2:
            assert time.monotonic() < deadline, "crashed child was not restarted"
            time.sleep(0.1)
    finally:
        sup.stop(timeout=10)
    procs = sup._procs
    assert all(p.poll() is not None for p in procs.values())
    assert procs["sleeper"].returncode != 0  # terminated by us, not finished by itself


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"  # a zombie has stopped; only its reaper is missing


@pytest.mark.timeout(60)
def test_stopping_a_child_ends_its_whole_process_group(tmp_path: Path) -> None:
    # Like a Celery worker's pool process: a grandchild that ignores SIGTERM.
    pid_file = tmp_path / "grandchild.pid"
    grandchild = (
        "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    )
    child = ChildSpec(
        "parent-of-one",
        [
            sys.executable,
            "-c",
            f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {grandchild!r}]); "
            "time.sleep(60)",
        ],
    )
    sup = ChildSupervisor([child], poll_interval=0.1)
    sup.start()
    try:
        deadline = time.monotonic() + 20
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the grandchild did not start"
            time.sleep(0.05)
    finally:
        sup.stop(timeout=5)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _running(pid):  # SIGKILL is asynchronous: wait for it to land
        assert time.monotonic() < deadline, f"grandchild {pid} outlived the supervisor's stop"
        time.sleep(0.05)
