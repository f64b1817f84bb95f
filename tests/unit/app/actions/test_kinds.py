"""An action kind declares its own effect when it finishes; finish_action knows no names."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.actions.kinds import kind_of, task_name
from app.actions.machine import claim_action, finish_action
from app.models.incident import Incident, IncidentEvent
from app.policy.plans import ActionName, PlannedAction
from tests.unit.app.actions.conftest import plan, skip_step

pytestmark = pytest.mark.timeout(60)


def finish(engine: Engine, aid: int, key: str, *, ok: bool) -> Incident:
    with Session(engine) as s:
        claim_action(s, action_id=aid, idempotency_key=key, worker="w1", lease_seconds=30)
        assert finish_action(s, action_id=aid, worker="w1", ok=ok, error=None if ok else "boom")
        s.commit()
        inc = s.exec(select(Incident)).one()
        s.expunge(inc)
        return inc


def timeline(engine: Engine) -> list[str]:
    with Session(engine) as s:
        return [e.type for e in s.exec(select(IncidentEvent).order_by(IncidentEvent.id)).all()]  # type: ignore[arg-type]


def test_enter_safe_mode_puts_the_incident_in_safe_mode_once(engine: Engine) -> None:
    safe = PlannedAction(ActionName.ENTER_SAFE_MODE, "j", "n0", False, {"reason": "x"})
    [(aid, key)] = plan(engine, safe)
    inc = finish(engine, aid, key, ok=True)
    assert inc.safe_mode and timeline(engine)[-2:] == ["action_succeeded", "safe_mode"]


def test_a_plain_kind_has_no_effect_beyond_its_entry_and_its_failure_counts(
    engine: Engine,
) -> None:
    [(aid, key)] = plan(engine, skip_step())
    inc = finish(engine, aid, key, ok=False)
    assert not inc.safe_mode and inc.recovery_failures == 1
    assert timeline(engine)[-1] == "action_failed"


def test_a_failed_release_is_not_a_failed_recovery() -> None:
    assert kind_of(ActionName.RELEASE_SAFE_MODE).failure_counts is False
    assert kind_of(ActionName.RESTART_ROLE).failure_counts is True
    assert kind_of("no_such_action") == kind_of(ActionName.RESTART_JOB)


def test_each_action_has_its_own_task() -> None:
    assert task_name(ActionName.RESTART_ROLE) == "recovery.restart_role"
