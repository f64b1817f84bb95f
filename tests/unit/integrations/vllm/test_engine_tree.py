"""integrations.vllm.server.find_engine_tree on a real process tree titled as vLLM titles its
own (setproctitle): the EngineCore is a child of the API server, the Worker a child of the
EngineCore, and a process a Worker forked (which carries the Worker's title until it execs) is
not a worker."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from integrations.vllm.server import EngineError, find_engine_tree

# The API server's stand-in: a child titled VLLM::EngineCore, whose child is titled
# VLLM::Worker_TP0 and forks one more process that keeps that title (as between fork and exec).
_TREE = """
import os, sys, time
from setproctitle import setproctitle
def hold():
    sys.stdout.flush()
    time.sleep(60)
if os.fork() == 0:
    setproctitle("VLLM::EngineCore")
    if os.fork() == 0:
        setproctitle("VLLM::Worker_TP0")
        if os.fork() == 0:
            print("forked", os.getpid(), os.getppid(), flush=True)
            hold()
        hold()
    hold()
hold()
"""


@pytest.fixture
def tree() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _TREE], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        yield proc
    finally:
        for p in psutil.Process(proc.pid).children(recursive=True):
            p.kill()
        proc.kill()
        proc.wait(10)


def _titled(pid: int, title: str) -> list[int]:
    return [
        p.pid for p in psutil.Process(pid).children(recursive=True) if p.cmdline()[:1] == [title]
    ]


def test_a_process_forked_by_a_worker_is_not_a_worker(tree: subprocess.Popen[str]) -> None:
    assert tree.stdout is not None
    forked, worker = (int(x) for x in tree.stdout.readline().split()[1:3])
    deadline = time.monotonic() + 10
    while not _titled(tree.pid, "VLLM::Worker_TP0") and time.monotonic() < deadline:
        time.sleep(0.05)
    [core] = _titled(tree.pid, "VLLM::EngineCore")
    found = find_engine_tree(tree.pid)
    assert found.engine_core == core
    assert found.workers == (worker,)
    assert forked not in found.pids()


def test_no_such_api_server_is_an_engine_error() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with pytest.raises(EngineError, match=f"no process {dead.pid}"):
        find_engine_tree(dead.pid)


def test_named_pids_are_the_levels_an_announcement_lists() -> None:
    from integrations.vllm.server import EngineTree

    assert EngineTree(10, 11, (12, 13)).named_pids() == {
        "api_server": 10,
        "engine_core": 11,
        "worker": 12,
        "worker1": 13,
    }
    assert EngineTree(10, None, ()).named_pids() == {"api_server": 10}  # not up, or dying
