"""The launcher's ``inject_fault`` request (rlguard drill) on a generic ``rlguard launch``
supervisor: kill and hang are injected into the named process and answered with what was done;
oom and disk-full (no injection point in a generic command), a role or rank it does not run and
bad values are refused with the reason and nothing is injected; a dry run injects nothing; a
drill armed for a later step is answered when the process reports that step, through the
hook's own protocol (a real request file, the supervisor's loop)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from recovery.report import HeartbeatReporter
from recovery.supervision import Child, Supervisor, requests
from recovery.supervision.events import read_events
from tests.harness import wait_for

pytestmark = pytest.mark.timeout(60)


def _sup(tmp_path: Path) -> Supervisor:
    return Supervisor(
        tmp_path,
        "job",
        [Child("trainer", 0), Child("rollout", 0)],
        command=lambda child: [sys.executable, "-c", "import time; time.sleep(60)"],
        timeout=30,
    )


def _ask(
    sup: Supervisor,
    role: str | None = "trainer",
    rank: Any = None,
    key: str = "drill-1",
    **extra: Any,
) -> dict[str, Any] | None:
    body = {
        "action": "inject_fault",
        "key": key,
        "role": role,
        "rank": rank,
        "extra": {"drill": key, **extra},
    }
    return sup.carry_out(requests.Request(sup.run_dir / f"{key}.json", body))


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.parametrize(
    ("role", "rank", "extra", "error"),
    [
        ("trainer", None, {"fault": "oom"}, "cannot make the next step of a generic command raise"),
        ("trainer", None, {"fault": "disk-full"}, "cannot make the next checkpoint write"),
        (
            "critic",
            None,
            {"fault": "kill"},
            "this launcher runs no process critic (it runs rollout-0, trainer-0)",
        ),
        ("trainer", "3", {"fault": "kill"}, "this launcher runs no process trainer-3"),
        (
            "trainer",
            None,
            {"fault": "explode"},
            "fault 'explode' is not one of kill, hang, oom, disk-full",
        ),
        (
            "trainer",
            None,
            {"fault": "kill", "at_step": -1},
            "at_step must be an integer >= 0, got -1",
        ),
        ("trainer", "x", {"fault": "kill"}, "rank must be a non-negative integer, got 'x'"),
        (None, None, {"fault": "kill"}, "inject_fault needs --role"),
    ],
)
def test_what_the_launcher_cannot_inject_is_refused_and_nothing_is_injected(
    tmp_path: Path, role: str | None, rank: Any, extra: dict[str, Any], error: str
) -> None:
    sup = _sup(tmp_path)
    sup.start()
    try:
        answer = _ask(sup, role=role, rank=rank, **extra)
        assert answer is not None and answer["ok"] is False, answer
        assert error in answer["error"], answer
        for c in sup.children:
            assert c.returncode is None and c.proc is not None and _state(c.proc.pid) != "T"
    finally:
        sup.close()


def test_kill_and_hang_are_injected_into_the_named_process_and_reported(tmp_path: Path) -> None:
    sup = _sup(tmp_path)
    sup.start()
    try:
        rollout = sup.children[1]
        assert rollout.proc is not None
        hung = _ask(sup, role="rollout", rank="0", key="drill-2", fault="hang")
        assert hung is not None and hung["ok"] is True, hung
        assert hung["target_pid"] == rollout.proc.pid and hung["target"] == "rollout-0"
        wait_for(lambda: _state(rollout.proc.pid) == "T", 5, "the rollout to be stopped")
        assert rollout.returncode is None  # stopped, not dead: a hang

        trainer = sup.children[0]
        assert trainer.proc is not None
        killed = _ask(sup, fault="kill")
        assert killed is not None and killed["ok"] is True and killed["fault"] == "kill"
        assert killed["injected_at"] > 0 and "SIGKILL trainer-0" in killed["what"]
        wait_for(lambda: trainer.returncode is not None, 5, "the trainer to die")
        assert trainer.returncode == -signal.SIGKILL
        assert sup.check_exits() == ["trainer-0"]  # reported like any crash: RLGuard sees it
        kinds = [e["kind"] for e in read_events(tmp_path / "events.jsonl")]
        assert kinds.count("drill_injected") == 2 and "restart" not in kinds
    finally:
        sup.close()


def test_a_dry_run_describes_and_injects_nothing(tmp_path: Path) -> None:
    sup = _sup(tmp_path)
    sup.start()
    try:
        answer = _ask(sup, fault="kill", dry_run=True)
        assert answer is not None and answer["ok"] is True and answer["dry_run"] is True
        assert answer["what"].startswith("SIGKILL trainer-0") and answer["what"].endswith(" now")
        assert sup.children[0].returncode is None
        kinds = [e["kind"] for e in read_events(tmp_path / "events.jsonl")]
        assert "drill_injected" not in kinds
    finally:
        sup.close()


def test_a_drill_armed_for_a_step_is_injected_and_answered_when_the_step_comes(
    tmp_path: Path,
) -> None:
    sup = _sup(tmp_path)
    sup.start()
    stop = threading.Event()
    loop = threading.Thread(
        target=lambda: [sup.tick() or stop.wait(0.05) for _ in iter(stop.is_set, True)]
    )
    loop.start()
    try:
        trainer = sup.children[0]
        assert trainer.proc is not None
        pid = trainer.proc.pid
        beat = HeartbeatReporter(tmp_path, "trainer", 0, job="job", pid=pid)
        beat.update(phase="TRAIN", step=3, force=True)
        answers: list[dict[str, Any]] = []
        asker = threading.Thread(
            target=lambda: answers.append(
                requests.submit(
                    tmp_path,
                    {
                        "action": "inject_fault",
                        "role": "trainer",
                        "rank": None,
                        "extra": {"fault": "kill", "at_step": 5, "drill": "d9"},
                    },
                    key="drill-9",
                    timeout=20,
                )
            )
        )
        asker.start()
        wait_for(
            lambda: any(e["kind"] == "drill_armed" for e in read_events(tmp_path / "events.jsonl")),
            10,
            "armed",
        )
        assert os.path.exists(f"/proc/{pid}") and trainer.returncode is None
        beat.update(phase="TRAIN", step=5, force=True)
        asker.join(20)
        [answer] = answers
        assert answer["ok"] is True and answer["step"] == 5 and answer["target_pid"] == pid
        wait_for(lambda: trainer.returncode is not None, 5, "the trainer to die")
    finally:
        stop.set()
        loop.join(10)
        sup.close()
