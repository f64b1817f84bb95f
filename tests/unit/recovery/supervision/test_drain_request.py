"""drain_node through the launcher hook's protocol: the local backend has no scheduler and
refuses it; a backend that drains gets the reason and the node; a request without a reason is
refused. Driven directly with a real child process (as test_supervisor.py)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from recovery.supervision import Child, Supervisor, requests
from recovery.supervision.backends.local import LocalBackend

pytestmark = pytest.mark.timeout(60)


class _DrainingBackend(LocalBackend):
    """The local backend plus a recorded drain (the Slurm one is tested against real Slurm)."""

    def __init__(self) -> None:
        self.drained: list[tuple[str, str | None]] = []

    def drain_node(self, reason: str, *, node: str | None = None) -> None:
        self.drained.append((reason, node))


def _ask(tmp_path: Path, backend: LocalBackend, body: dict[str, Any]) -> dict[str, Any]:
    sup = Supervisor(
        tmp_path,
        "job",
        [Child("worker", 0)],
        backend=backend,
        timeout=30,
        command=lambda child: [sys.executable, "-c", "import time; time.sleep(30)"],
    )
    sup.start()
    answers: list[dict[str, Any]] = []
    try:
        asker = threading.Thread(
            target=lambda: answers.append(requests.submit(tmp_path, body, key="d/1", timeout=20))
        )
        asker.start()
        while asker.is_alive():
            sup.tick()
            time.sleep(0.01)
        asker.join()
    finally:
        sup.close()
    return answers[0]


def test_local_backend_refuses_to_drain(tmp_path: Path) -> None:
    answer = _ask(
        tmp_path,
        LocalBackend(),
        {"action": "drain_node", "node": "n1", "extra": {"reason": "rlguard: XID 79"}},
    )
    assert (answer["ok"], answer["error"]) == (False, "the local backend cannot drain a node")


def test_a_draining_backend_gets_the_reason_and_the_node(tmp_path: Path) -> None:
    backend = _DrainingBackend()
    answer = _ask(
        tmp_path,
        backend,
        {"action": "drain_node", "node": "n1", "extra": {"reason": "rlguard: gpu 0 XID 79"}},
    )
    assert answer["ok"] and backend.drained == [("rlguard: gpu 0 XID 79", "n1")]


def test_a_drain_without_a_reason_is_refused(tmp_path: Path) -> None:
    backend = _DrainingBackend()
    answer = _ask(tmp_path, backend, {"action": "drain_node", "node": "n1", "extra": {}})
    assert not answer["ok"] and "needs a reason" in answer["error"] and backend.drained == []
