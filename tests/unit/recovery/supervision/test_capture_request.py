"""The launcher's ``capture_stacks`` request: answered at once, for the processes of a role,
never restarting or holding anything; a bad request is refused naming what is wrong."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from recovery.control import ControlMode, write_control
from recovery.supervision import Child, Supervisor, requests
from recovery.supervision.events import read_events
from recovery.supervision.stacks import find_py_spy

pytestmark = pytest.mark.timeout(60)


def _sup(tmp_path: Path) -> Supervisor:
    return Supervisor(
        tmp_path,
        "job",
        [Child("trainer", 0), Child("trainer", 1)],
        command=lambda child: [sys.executable, "-c", "import time; time.sleep(60)"],
        timeout=30,
        py_spy=find_py_spy(),
    )


def _ask(sup: Supervisor, **body: object) -> dict | None:
    return sup.carry_out(
        requests.Request(sup.run_dir / "r.json", {"action": "capture_stacks", "key": "k", **body})
    )


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"role": "rollout"}, "no process with role 'rollout' rank None"),
        ({"role": "trainer", "rank": "7"}, "no process with role 'trainer' rank '7'"),
        ({"role": "trainer", "extra": {"timeout_seconds": "soon"}}, "bad timeout or size"),
    ],
)
def test_a_bad_request_is_refused_by_name(tmp_path: Path, body: dict, error: str) -> None:
    sup = _sup(tmp_path)
    answer = _ask(sup, **body)
    assert answer is not None and answer["ok"] is False and error in answer["error"]


def test_every_rank_of_the_role_is_read_and_nothing_is_restarted_even_in_safe_mode(
    tmp_path: Path,
) -> None:
    sup = _sup(tmp_path)
    sup.start()
    try:
        write_control(tmp_path, ControlMode.SAFE_MODE, "an approver decides", timeout=5)
        pids = [c.proc.pid for c in sup.children if c.proc is not None]
        sup.kill(sup.children[1])  # rank 1 is gone: its capture says so, rank 0's goes on
        answer = _ask(sup, role="trainer", extra={"timeout_seconds": 10, "max_bytes": 4096})
        assert answer is not None and answer["ok"] is True
        first, second = answer["stacks"]
        assert (first["rank"], first["pid"]) == (0, pids[0])
        assert (second["rank"], second["ok"]) == (1, False)
        assert second["reason"] == "process gone: it exited (-9) before the capture"
        assert sup.children[0].proc is not None and sup.children[0].proc.pid == pids[0]
        assert sup.children[0].returncode is None  # read, not restarted
        kinds = [e["kind"] for e in read_events(tmp_path / "events.jsonl")]
        assert kinds.count("stacks_captured") == 2 and "restart" not in kinds
        assert "restart_held" not in kinds  # SAFE_MODE holds restarts, not reads
    finally:
        sup.close()
