"""The generic supervisor's contract, driven directly with real child processes."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from recovery.report import heartbeat_path, read_heartbeat
from recovery.supervision import Child, RestartBudget, RestartBudgetError, Supervisor, requests
from recovery.supervision.events import read_events

pytestmark = pytest.mark.timeout(60)


class _Recording(Supervisor):
    """Reads the child's heartbeat at the moment each event is announced."""

    seen: list[tuple[str, Any]]

    def event(self, kind: str, **fields: Any) -> None:
        if kind == "child_exit":
            beat = (
                read_heartbeat(heartbeat_path(self.run_dir, fields["role"], fields["rank"])) or {}
            )
            self.seen.append((kind, beat.get("phase")))
        super().event(kind, **fields)


def _supervisor(
    tmp_path: Path, code: str, cls: type[Supervisor] = Supervisor, **kw: Any
) -> Supervisor:
    return cls(
        tmp_path,
        "job",
        [Child("worker", 0)],
        command=lambda child: [sys.executable, "-c", code],
        timeout=30,
        **kw,
    )


def test_the_exit_is_in_the_heartbeat_before_it_is_announced(tmp_path: Path) -> None:
    sup = _supervisor(tmp_path, "import sys; sys.exit(3)", _Recording)
    assert isinstance(sup, _Recording)
    sup.seen = []
    sup.start()
    try:
        while not sup.seen:
            sup.tick()
    finally:
        sup.close()
    assert sup.seen == [("child_exit", "EXITED")]
    beat = read_heartbeat(heartbeat_path(tmp_path, "worker", 0)) or {}
    assert (beat["exit_code"], beat["job"], "exit_signal" in beat) == (3, "job", False)


def test_a_clean_exit_is_done_not_a_fault_and_ends_the_loop(tmp_path: Path) -> None:
    sup = _supervisor(tmp_path, "pass")
    sup.start()
    try:
        assert sup.loop() == 0
    finally:
        sup.close()
    assert (read_heartbeat(heartbeat_path(tmp_path, "worker", 0)) or {})["phase"] == "DONE"
    kinds = [e["kind"] for e in read_events(tmp_path / "events.jsonl")]
    assert kinds == ["spawn", "child_exit", "job_done"]


def test_a_request_to_a_launcher_that_does_not_run_is_refused_at_once(tmp_path: Path) -> None:
    with pytest.raises(requests.LauncherError, match="no launcher is running"):
        requests.submit(tmp_path, {"action": "restart_role"}, key="k", timeout=5)
    assert not requests.requests_dir(tmp_path).exists()


def test_a_restart_waits_its_backoff_and_is_answered_once(tmp_path: Path) -> None:
    sup = _supervisor(
        tmp_path,
        "import sys; sys.exit(1)",
        budget=RestartBudget(max_restarts=5, backoff=0.3, backoff_max=1),
    )
    sup.start()
    answers: list[dict[str, Any]] = []
    try:
        while not sup.check_exits():
            time.sleep(0.01)
        asker = threading.Thread(
            target=lambda: answers.append(
                requests.submit(
                    tmp_path, {"action": "restart_role", "role": "worker"}, key="a/1", timeout=20
                )
            )
        )
        asker.start()
        while asker.is_alive():
            sup.tick()
            time.sleep(0.01)
        asker.join()
    finally:
        sup.close()
    assert answers[0]["ok"] is True and answers[0]["budget_left"] == 4
    backoff = [e for e in read_events(tmp_path / "events.jsonl") if e["kind"] == "restart_backoff"]
    assert backoff and backoff[0]["delay_s"] == pytest.approx(
        0.3
    )  # it died at once: a quick failure
    # Asking again with the answered key gets the same answer, even with the launcher gone.
    again = requests.submit(
        tmp_path, {"action": "restart_role", "role": "worker"}, key="a/1", timeout=1
    )
    assert again == answers[0]
    assert len([e for e in read_events(tmp_path / "events.jsonl") if e["kind"] == "spawn"]) == 2


def test_restart_budget_backoff_doubles_per_quick_failure_up_to_its_cap() -> None:
    budget = RestartBudget(max_restarts=2, backoff=1, backoff_max=5)
    assert [budget.delay(n) for n in range(5)] == [0, 1, 2, 4, 5]
    assert budget.spend() and budget.spend() and not budget.spend()
    assert budget.left == 0 and budget.used == 2


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"max_restarts": -1}, "max_restarts"),
        ({"max_restarts": True}, "max_restarts"),
        ({"backoff": float("nan")}, "backoff"),
        ({"backoff": 3, "backoff_max": 2}, "backoff_max (2)"),
    ],
)
def test_restart_budget_refuses_bad_settings(kw: dict[str, Any], needle: str) -> None:
    with pytest.raises(RestartBudgetError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        RestartBudget(**kw)


def test_a_second_request_during_the_backoff_joins_the_pending_restart(tmp_path: Path) -> None:
    sup = _supervisor(
        tmp_path,
        "import sys; sys.exit(1)",
        budget=RestartBudget(max_restarts=5, backoff=0.5, backoff_max=1),
    )
    sup.start()
    answers: dict[str, dict[str, Any]] = {}

    def ask(key: str) -> threading.Thread:
        t = threading.Thread(
            target=lambda: answers.__setitem__(
                key,
                requests.submit(
                    tmp_path, {"action": "restart_role", "role": "worker"}, key=key, timeout=20
                ),
            )
        )
        t.start()
        return t

    try:
        while not sup.check_exits():
            time.sleep(0.01)
        first = ask("inc1/restart_role")
        while not any(
            e["kind"] == "restart_backoff" for e in read_events(tmp_path / "events.jsonl")
        ):
            sup.tick()
            time.sleep(0.01)
        second = ask("inc2/restart_role")  # another incident about the same process
        while len(requests.pending(tmp_path)) < 2:  # no tick meanwhile: the backoff cannot end
            time.sleep(0.01)
        while first.is_alive() or second.is_alive():
            sup.tick()
            time.sleep(0.01)
    finally:
        sup.close()
    assert (
        answers["inc1/restart_role"]["restarted"]
        == answers["inc2/restart_role"]["restarted"]
        == ["worker-0"]
    )
    spawns = [e for e in read_events(tmp_path / "events.jsonl") if e["kind"] == "spawn"]
    assert len(spawns) == 2 and sup.budget.used == 1
