"""The stacks a restart captured go onto its incident's timeline at once: one entry per
process, bounded, once per action however often the task runs, failures with their reason."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.actions.machine import ActionSnapshot
from app.actions.stacks import attach_stacks
from app.models.incident import IncidentEvent, IncidentEventType
from app.policy.plans import ActionName, PlannedAction
from tests.unit.app.actions.conftest import plan


def _restart(engine: Engine, max_bytes: int = 65536) -> ActionSnapshot:
    [(action_id, key)] = plan(
        engine,
        PlannedAction(
            ActionName.RESTART_ROLE,
            "j",
            "n0",
            False,
            {
                "role": "trainer",
                "rank": 0,
                "capture_stacks": {"timeout_seconds": 10, "max_bytes": max_bytes},
            },
        ),
    )
    with Session(engine) as s:
        from app.models.action import RecoveryAction

        row = s.get(RecoveryAction, action_id)
        assert row is not None
        return ActionSnapshot(
            action_id, row.incident_id, row.action, row.job, row.node, dict(row.params), 1, key
        )


def _stacks(engine: Engine) -> list[dict]:
    with Session(engine) as s:
        return [
            e.detail
            for e in s.exec(
                select(IncidentEvent).where(
                    IncidentEvent.type == IncidentEventType.STACKS_CAPTURED.value
                )
            ).all()
        ]


OK = {
    "role": "trainer",
    "rank": 0,
    "pid": 4242,
    "ok": True,
    "captured_at": 1796198574.5,
    "text": "Thread 4242 (idle)\n    stuck_in_a_collective (train.py:12)\n",
    "reason": "",
}
GONE = {
    "role": "trainer",
    "rank": 1,
    "pid": 4243,
    "ok": False,
    "text": "",
    "reason": "process gone: it exited (-9) before the capture",
}


def test_each_capture_is_one_entry_with_its_text_or_its_reason(engine: Engine) -> None:
    a = _restart(engine)
    assert attach_stacks(engine, "w1", a, [OK, GONE]) is True
    ok, gone = _stacks(engine)
    assert ok["action_id"] == a.id and ok["node"] == "n0" and ok["pid"] == 4242
    assert ok["ok"] is True and "stuck_in_a_collective" in ok["text"] and ok["reason"] == ""
    assert ok["captured_at"].startswith("2026-12-02T")
    assert (gone["ok"], gone["text"], gone["reason"]) == (False, "", GONE["reason"])


def test_a_retried_task_does_not_add_the_stacks_twice(engine: Engine) -> None:
    a = _restart(engine)
    attach_stacks(engine, "w1", a, [OK])
    attach_stacks(engine, "w2", a, [OK])
    assert len(_stacks(engine)) == 1


def test_the_text_is_bounded_again_whatever_the_launcher_sent(engine: Engine) -> None:
    a = _restart(engine, max_bytes=2048)
    huge = {**OK, "text": "frame (x.py:1)\n" * 10_000}
    attach_stacks(engine, "w1", a, [huge])
    [row] = _stacks(engine)
    assert len(row["text"].encode()) <= 2048 and row["truncated"] is True
    assert "[... truncated by RLGuard:" in row["text"]


def test_ok_without_text_is_not_ok(engine: Engine) -> None:
    a = _restart(engine)
    attach_stacks(engine, "w1", a, [{**OK, "text": ""}])
    [row] = _stacks(engine)
    assert row["ok"] is False and row["reason"] == "the launcher returned no stacks"


def test_a_database_that_is_away_costs_the_stacks_not_the_restart(engine: Engine) -> None:
    a = _restart(engine)
    # A database that cannot be reached: OperationalError on connect, as with PostgreSQL down.
    away = sa.create_engine(str(engine.url).replace("db.sqlite", "missing/db.sqlite"))
    assert attach_stacks(away, "w1", a, [OK]) is False
    assert _stacks(engine) == []
