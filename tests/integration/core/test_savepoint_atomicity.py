"""An incident opened by a policy tick is written with its timeline and actions in one
transaction, on SQLite as on PostgreSQL: nothing of it is visible to another connection before
the tick commits, and a rollback (the crash of the tick) leaves nothing. On SQLite the savepoint
around the incident's insert once committed that row on its own (pysqlite does not begin a
transaction before a SAVEPOINT; ``app.core.db.begin_savepoint``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.core.db import make_engine
from app.incidents.persist import persist_decisions
from app.policy.engine import DecisionType, IncidentDecision
from app.policy.plans import ActionName, PlannedAction
from app.policy.policy_file import default_policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject, Tier

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
def engine(migrated_url: str) -> Iterator[Engine]:
    eng = make_engine(migrated_url)
    try:
        yield eng
    finally:
        eng.dispose()


def counts(engine: Engine) -> tuple[int, int, int]:
    with engine.connect() as conn:
        return tuple(  # type: ignore[return-value]
            conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in ("incident", "incident_event", "recovery_action")
        )


def opening() -> IncidentDecision:
    subject = Subject(node="n1", job="j", role="trainer", rank=0)
    sig = FaultSignal(FaultKind.STEP_FAILED, subject, Evidence(metric=None), Tier.LIGHT, 0.0)
    act = PlannedAction(ActionName.SKIP_FAILED_STEP, "j", "n1", False, {"step": 3})
    return IncidentDecision(
        DecisionType.OPEN, sig.incident_key, sig.kind, subject, Tier.LIGHT, 0.0, sig, (act,)
    )


def test_nothing_of_an_opened_incident_shows_before_the_commit_or_after_a_rollback(
    engine: Engine,
) -> None:
    with Session(engine) as s:
        out = persist_decisions(s, decisions=[opening()], policy=default_policy())
        assert out.opened and out.new_actions
        assert counts(engine) == (0, 0, 0)  # another connection sees none of it yet
        s.rollback()
    assert counts(engine) == (0, 0, 0)
    with Session(engine) as s:
        persist_decisions(s, decisions=[opening()], policy=default_policy())
        s.commit()
    incidents, events, actions = counts(engine)
    assert (incidents, actions) == (1, 1) and events >= 2
