from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.core import migrate
from app.core.db import make_engine
from app.incidents.persist import persist_decisions
from app.models.action import RecoveryAction
from app.policy.engine import DecisionType, IncidentDecision
from app.policy.plans import ActionName, PlannedAction
from app.policy.policy_file import default_policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject, Tier

SUBJ = Subject(node="n0", job="j", role="trainer", rank=0)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    migrate.upgrade(url)
    eng = make_engine(url)
    yield eng
    eng.dispose()


def plan(engine: Engine, *actions: PlannedAction, tier: Tier = Tier.LIGHT) -> list[tuple[int, str]]:
    """Open one incident through the planner; returns (id, idempotency key) of its actions."""
    sig = FaultSignal(FaultKind.STEP_FAILED, SUBJ, Evidence(metric="m", detail="why"), tier, 100.0)
    decision = IncidentDecision(
        DecisionType.OPEN, sig.incident_key, FaultKind.STEP_FAILED, SUBJ, tier, 100.0, sig, actions
    )
    with Session(engine) as s:
        out = persist_decisions(s, decisions=[decision], policy=default_policy())
        s.commit()
        return [(i, s.get(RecoveryAction, i).idempotency_key) for i in out.new_actions]  # type: ignore[union-attr]


def skip_step() -> PlannedAction:
    return PlannedAction(ActionName.SKIP_FAILED_STEP, "j", "n0", False, {"step": 3})
