"""write_plan, the one writer of action rows, and add_event's vocabulary, on a migrated SQLite
database (no network)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.core import migrate
from app.core.db import make_engine
from app.incidents.persist import insert_open_incident
from app.incidents.planning import action_key, batch_of, write_plan
from app.incidents.timeline import add_event
from app.models._types import utcnow
from app.models.action import RecoveryAction
from app.models.approval import Approval
from app.models.incident import Incident, IncidentEvent, IncidentEventType
from app.policy.plans import ActionName, PlannedAction

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    migrate.upgrade(url)
    eng = make_engine(url)
    yield eng
    eng.dispose()


def _incident(session: Session, key: str = "k") -> Incident:
    inc = Incident(key=key, open_key=key, kind="step_failed", tier="light", job="j")
    assert insert_open_incident(session, inc)
    return inc


def test_keys_name_incident_batch_and_action() -> None:
    assert action_key(7, "s2", "restart_role:j") == "inc7/s2/restart_role:j"
    assert batch_of("inc7/release3/n0") == "inc7/release3"


def test_plan_actions_writes_pending_rows_keyed_by_batch_and_identity(engine: Engine) -> None:
    skip = PlannedAction(ActionName.SKIP_FAILED_STEP, "j", "n0", False, {"step": 3})
    restart = PlannedAction(ActionName.RESTART_ROLE, "j", None, False, {"role": "rollout"})
    with Session(engine) as s:
        inc = _incident(s)
        rows = write_plan(s, incident=inc, actions=[skip, restart], batch="s0", now=utcnow())
        s.commit()
        assert [r.id for r in rows] == sorted(r.id for r in rows if r.id is not None)
        assert [(r.idempotency_key, r.status, r.queue, r.approval_id) for r in rows] == [
            (f"inc{inc.id}/s0/skip_failed_step:j:n0:3", "pending", "node.n0", None),
            (f"inc{inc.id}/s0/restart_role:j:rollout", "pending", "cluster", None),
        ]


def test_an_action_needing_approval_waits_for_it(engine: Engine) -> None:
    restore = PlannedAction(ActionName.RESTORE_CHECKPOINT, "j", None, True)
    with Session(engine) as s:
        inc = _incident(s)
        with pytest.raises(ValueError, match="restore_checkpoint needs approval"):
            write_plan(s, incident=inc, actions=[restore], batch="s0", now=utcnow())
        appr = Approval(incident_id=inc.id, summary="x", expires_at=utcnow() + timedelta(hours=1))
        s.add(appr)
        s.flush()
        [row] = write_plan(
            s, incident=inc, actions=[restore], batch="s0", now=utcnow(), approval_id=appr.id
        )
        assert (row.status, row.approval_id) == ("pending_approval", appr.id)


def test_the_same_batch_written_twice_collides_on_its_key(engine: Engine) -> None:
    skip = PlannedAction(ActionName.SKIP_FAILED_STEP, "j", "n0", False, {"step": 3})
    with Session(engine) as s:
        inc = _incident(s)
        write_plan(s, incident=inc, actions=[skip], batch="s0", now=utcnow())
        with pytest.raises(Exception, match="UNIQUE"):
            write_plan(s, incident=inc, actions=[skip], batch="s0", now=utcnow())


def test_a_second_open_incident_with_the_same_key_is_refused(engine: Engine) -> None:
    with Session(engine) as s:
        _incident(s, "same")
        assert not insert_open_incident(
            s, Incident(key="same", open_key="same", kind="step_failed", tier="light")
        )
        s.commit()
        assert len(s.exec(select(Incident)).all()) == 1


def test_add_event_refuses_a_type_outside_the_vocabulary(engine: Engine) -> None:
    with Session(engine) as s:
        inc = _incident(s)
        with pytest.raises(ValueError, match="approval_grantd"):
            add_event(s, incident_id=inc.id, type_="approval_grantd")  # type: ignore[arg-type]
        add_event(s, incident_id=inc.id, type_=IncidentEventType.APPROVAL_GRANTED)
        s.commit()
        assert [e.type for e in s.exec(select(IncidentEvent)).all()] == ["approval_granted"]
        assert s.exec(select(RecoveryAction)).all() == []
