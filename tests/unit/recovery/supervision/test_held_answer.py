"""A restart whose answer waits until the restarted role serves again (``restart_answer``):
the request is answered once, with what the job adds, and never carried out twice meanwhile."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from recovery.supervision import Child, Supervisor, requests
from recovery.supervision.events import read_events

pytestmark = pytest.mark.timeout(60)


class _ServesWhenTold(Supervisor):
    ready = False
    asked = 0

    def restart_answer(
        self, children: list[Child], answer: dict[str, Any], spawned_at: float
    ) -> dict[str, Any] | None:
        self.asked += 1
        return {**answer, "stages": ["replaced", "readmitted"]} if self.ready else None


def test_a_held_answer_is_sent_once_the_job_says_and_the_role_is_restarted_once(
    tmp_path: Path,
) -> None:
    sup = _ServesWhenTold(
        tmp_path,
        "job",
        [Child("worker", 0)],
        command=lambda child: [sys.executable, "-c", "import time; time.sleep(60)"],
    )
    sup.start()
    answers: list[dict[str, Any]] = []
    asker = threading.Thread(
        target=lambda: answers.append(
            requests.submit(
                tmp_path, {"action": "restart_role", "role": "worker"}, key="held/1", timeout=30
            )
        )
    )
    try:
        asker.start()
        while sup.asked < 5:  # several rounds with the answer held
            sup.tick()
            time.sleep(0.01)
        assert not answers and asker.is_alive()
        sup.ready = True
        while asker.is_alive():
            sup.tick()
            time.sleep(0.01)
        asker.join()
    finally:
        sup.close()
    assert len(answers) == 1
    assert {k: answers[0][k] for k in ("ok", "restarted", "stages")} == {
        "ok": True,
        "restarted": ["worker-0"],
        "stages": ["replaced", "readmitted"],
    }
    spawns = [e for e in read_events(tmp_path / "events.jsonl") if e["kind"] == "spawn"]
    assert len(spawns) == 2  # the first start and one restart, however long the answer waited
