"""The gate on the real write path (persist_decisions on a migrated SQLite database): restart
budgets, circuit breakers (trip, block, reset), dry run, hands off and backoff, each on the
incident's timeline."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app.actions.outbox import OutboxDispatcher, due_for_dispatch
from app.auth.users import create_user
from app.core import migrate
from app.core.db import make_engine
from app.core.errors import Conflict, Forbidden, InvalidInput, NotFound
from app.guardrails import automation
from app.guardrails.gate import Verdict, gate
from app.incidents import breaker_reset
from app.incidents.persist import PersistResult, persist_decisions
from app.models import AuditEvent, Job, Role
from app.models.action import RecoveryAction
from app.models.guardrails import CircuitBreaker
from app.models.incident import Incident, IncidentEvent
from app.policy.engine import DecisionType, IncidentDecision
from app.policy.plans import ActionName, PlannedAction
from app.policy.policy_file import BreakerLimits, Policy, default_policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject, Tier

pytestmark = pytest.mark.timeout(60)

T0 = datetime(2026, 12, 2, 4, 0, tzinfo=UTC)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    migrate.upgrade(url)
    eng = make_engine(url)
    with Session(eng) as s:
        s.add(Job(name="j"))
        s.add(Job(name="k"))
        s.commit()
    yield eng
    eng.dispose()


def restart(rank: int = 1, job: str = "j", node: str = "n1") -> PlannedAction:
    return PlannedAction(
        ActionName.RESTART_ROLE, job, node, False, {"role": "rollout", "rank": rank}
    )


def fault(rank: int = 1, job: str = "j", node: str = "n1") -> IncidentDecision:
    """A rollout rank lost: one incident per (job, rank), planning one restart."""
    subj = Subject(node=node, job=job, role="rollout", rank=rank)
    sig = FaultSignal(
        FaultKind.HEARTBEAT_LOST, subj, Evidence(metric="m", detail="gone"), Tier.MEDIUM, 100.0
    )
    return IncidentDecision(
        DecisionType.OPEN,
        sig.incident_key,
        FaultKind.HEARTBEAT_LOST,
        subj,
        Tier.MEDIUM,
        100.0,
        sig,
        (restart(rank, job, node),),
    )


def persist(
    engine: Engine,
    d: IncidentDecision,
    *,
    now: datetime,
    policy: Policy | None = None,
    dry_run: bool = False,
) -> PersistResult:
    with Session(engine) as s:
        out = persist_decisions(
            s, decisions=[d], policy=policy or default_policy(), now=now, dry_run=dry_run
        )
        s.commit()
    return out


def flap(engine: Engine, d: IncidentDecision, *, now: datetime, **kw: Any) -> Incident:
    """The fault opens an incident, then resolves (its restart worked), as a flapping rank does."""
    out = persist(engine, d, now=now, **kw)
    with Session(engine) as s:
        inc = s.exec(
            select(Incident).where(Incident.key == d.key).order_by(col(Incident.id).desc())
        ).first()
        assert inc is not None
        if out.opened:
            inc.status, inc.open_key = "resolved", None
            s.add(inc)
            s.commit()
        s.refresh(inc)
        return inc


def timeline(engine: Engine, incident_id: int | None) -> list[tuple[str, dict[str, Any]]]:
    with Session(engine) as s:
        rows = s.exec(
            select(IncidentEvent)
            .where(IncidentEvent.incident_id == incident_id)
            .order_by(col(IncidentEvent.id))
        ).all()
        return [(r.type, r.detail) for r in rows]


def actions_of(engine: Engine, incident_id: int | None) -> list[RecoveryAction]:
    with Session(engine) as s:
        return list(
            s.exec(select(RecoveryAction).where(RecoveryAction.incident_id == incident_id)).all()
        )


def test_a_flapping_rank_is_restarted_three_times_then_escalated_to_heavy(engine: Engine) -> None:
    for i in range(3):
        inc = flap(engine, fault(), now=T0 + timedelta(minutes=i))
        [row] = actions_of(engine, inc.id)
        assert (row.status, row.approval_id, inc.tier) == ("pending", None, "medium")
    fourth = flap(engine, fault(), now=T0 + timedelta(minutes=3))
    assert (fourth.tier, fourth.escalated) == ("heavy", True)
    [row] = actions_of(engine, fourth.id)
    assert row.status == "pending_approval" and row.approval_id is not None
    events = timeline(engine, fourth.id)
    [spent] = [d for t, d in events if t == "guardrail_escalated"]
    assert spent["reason"] == "not run: restart budget of rollout/1 spent, 3 in 30 min"
    assert [t for t, _ in events] == [
        "opened",
        "guardrail_escalated",
        "escalated",
        "approval_requested",
        "action_planned",
    ]
    # another rank of the same job still has its budget; the window slides past the first three
    other = flap(engine, fault(rank=2), now=T0 + timedelta(minutes=4))
    assert actions_of(engine, other.id)[0].status == "pending"
    later = flap(engine, fault(), now=T0 + timedelta(minutes=31))
    assert (later.tier, actions_of(engine, later.id)[0].status) == ("medium", "pending")


def test_the_breaker_trips_once_blocks_its_scope_and_an_approver_resets_it(engine: Engine) -> None:
    rails = default_policy().guardrails.model_copy(
        update={"job_breaker": BreakerLimits(max_actions=2, max_nodes=8, window_seconds=600)}
    )
    policy = default_policy().model_copy(update={"guardrails": rails})
    for rank in (0, 1):
        inc = flap(engine, fault(rank=rank), now=T0, policy=policy)
        assert actions_of(engine, inc.id)[0].status == "pending"
    tripping = flap(engine, fault(rank=2), now=T0 + timedelta(seconds=5), policy=policy)
    assert tripping.tier == "heavy"
    [(t, d)] = [(t, d) for t, d in timeline(engine, tripping.id) if t == "breaker_tripped"]
    assert d["breaker"] == "job:j" and "3 automatic actions in 10 min (limit 2)" in d["reason"]
    assert actions_of(engine, tripping.id)[0].status == "pending_approval"
    # open: the next automatic action of the job is not written at all, and does not go heavy
    blocked = flap(engine, fault(rank=3), now=T0 + timedelta(seconds=6), policy=policy)
    assert blocked.tier == "medium" and actions_of(engine, blocked.id) == []
    [d] = [d for t, d in timeline(engine, blocked.id) if t == "action_not_run"]
    assert d["reason"].startswith("not run: circuit breaker job:j open since")
    # another job is another scope
    assert (
        actions_of(engine, flap(engine, fault(job="k"), now=T0, policy=policy).id)[0].status
        == "pending"
    )
    with Session(engine) as s:
        appr = create_user(s, name="ann", role=Role.approver, actor="test")[0]
        with pytest.raises(InvalidInput, match="'job j'"):
            breaker_reset.reset_breaker(s, scope="job j", actor="user:ann")
        with pytest.raises(NotFound):
            breaker_reset.reset_breaker(s, scope="cluster", actor="user:ann")
        row = breaker_reset.reset_breaker(
            s, scope="job:j", actor=f"user:{appr.name}", now=T0 + timedelta(seconds=7)
        )
        s.commit()
        assert (row.open, row.reset_by, row.trips, row.incident_id) == (
            False,
            "user:ann",
            1,
            tripping.id,
        )
        with pytest.raises(Conflict):
            breaker_reset.reset_breaker(s, scope="job:j", actor="user:ann")
        assert (
            s.exec(select(AuditEvent).where(AuditEvent.action == "breaker.reset")).one().target
            == "job:j"
        )
    # after the reset the count starts afresh: the actions before it are not counted again
    again = flap(engine, fault(rank=4), now=T0 + timedelta(seconds=8), policy=policy)
    assert actions_of(engine, again.id)[0].status == "pending"


def test_the_breaker_counts_distinct_nodes_too(engine: Engine) -> None:
    rails = default_policy().guardrails.model_copy(
        update={"cluster_breaker": BreakerLimits(max_actions=50, max_nodes=2, window_seconds=600)}
    )
    policy = default_policy().model_copy(update={"guardrails": rails})
    flap(engine, fault(rank=0, node="a"), now=T0, policy=policy)
    flap(engine, fault(rank=1, node="b"), now=T0, policy=policy)
    third = flap(engine, fault(rank=2, node="c", job="k"), now=T0, policy=policy)
    [d] = [d for t, d in timeline(engine, third.id) if t == "breaker_tripped"]
    assert d["breaker"] == "cluster" and "on 3 nodes" in d["reason"]
    with Session(engine) as s:
        assert s.get(CircuitBreaker, "cluster").open  # type: ignore[union-attr]


def test_dry_run_writes_rows_that_are_never_due_and_never_sent(engine: Engine) -> None:
    heavy = (restart(), PlannedAction(ActionName.RESTORE_CHECKPOINT, "j", None, True))
    d = fault()
    d = IncidentDecision(d.type, d.key, d.kind, d.subject, Tier.HEAVY, d.at, d.signal, heavy)
    out = persist(engine, d, now=T0, dry_run=True)
    assert out.new_actions == [] and out.approvals == []  # nothing to send, nobody to ask
    rows = actions_of(engine, out.opened[0])
    assert {r.status for r in rows} == {"dry_run"} and len(rows) == 2
    reasons = [d["reason"] for t, d in timeline(engine, out.opened[0]) if t == "action_dry_run"]
    assert (
        reasons[0] == "dry run (the setting): would run restart_role on job j, rollout/1, node n1"
    )
    sent: list[str] = []

    class Broker:  # the Celery boundary: what the dispatcher would hand the broker
        def send_task(self, name: str, **_: Any) -> None:
            sent.append(name)

    report = OutboxDispatcher(engine=engine, celery_app=Broker()).dispatch_due(
        now=T0 + timedelta(hours=1)
    )  # type: ignore[arg-type]
    assert (report.sent, report.pending, sent) == (0, 0, [])
    # dry-run rows count against no budget: with dry run off the next one runs
    with Session(engine) as s:
        first = s.get(Incident, out.opened[0])
        assert first is not None
        first.status, first.open_key = "resolved", None
        s.commit()
    for i in range(3):
        flap(engine, fault(), now=T0 + timedelta(minutes=i), dry_run=True)
    assert (
        actions_of(engine, flap(engine, fault(), now=T0 + timedelta(minutes=5)).id)[0].status
        == "pending"
    )


def test_a_jobs_switches_dry_run_and_hands_off(engine: Engine) -> None:
    with Session(engine, expire_on_commit=False) as s:
        op = create_user(s, name="op", role=Role.operator, actor="test")[0]
        appr = create_user(s, name="ap", role=Role.approver, actor="test")[0]
        with pytest.raises(Forbidden, match="hands_off needs the approver role"):
            automation.set_job_automation(s, job="j", user=op, hands_off=True)
        with pytest.raises(NotFound):
            automation.set_job_automation(s, job="nope", user=appr, dry_run=True)
        with pytest.raises(InvalidInput):
            automation.set_job_automation(s, job="j", user=appr)
        automation.set_job_automation(s, job="j", user=op, dry_run=True, reason="first week")
        s.commit()
    inc = flap(engine, fault(), now=T0)
    assert [r.status for r in actions_of(engine, inc.id)] == ["dry_run"]
    assert any(
        d["reason"].startswith("dry run (job j)")
        for t, d in timeline(engine, inc.id)
        if t == "action_dry_run"
    )
    assert actions_of(engine, flap(engine, fault(job="k"), now=T0).id)[0].status == "pending"
    with Session(engine, expire_on_commit=False) as s:
        automation.set_job_automation(s, job="j", user=appr, dry_run=False, hands_off=True)
        s.commit()
        audits = s.exec(select(AuditEvent).where(AuditEvent.action == "job.automation")).all()
        assert [a.detail["after"] for a in audits] == [
            {"dry_run": True, "hands_off": False},
            {"dry_run": False, "hands_off": True},
        ]
    paused = flap(engine, fault(), now=T0 + timedelta(minutes=1))
    assert actions_of(engine, paused.id) == []
    [d] = [d for t, d in timeline(engine, paused.id) if t == "action_not_run"]
    assert d["reason"].startswith("not run: automation of job j is paused (hands off)")
    # an action that waits for an approver anyway is still asked for: a person decides it
    with Session(engine) as s:
        [v] = gate(
            s,
            actions=[PlannedAction(ActionName.RESTART_JOB, "j", None, True)],
            rails=default_policy().guardrails,
            now=T0,
            incident_id=None,
        )
        assert v.verdict is Verdict.RUN


def test_backoff_writes_the_row_but_the_outbox_waits_for_it(engine: Engine) -> None:
    budgets = {
        ActionName.RESTART_ROLE: default_policy()
        .guardrails.budgets[ActionName.RESTART_ROLE]
        .model_copy(update={"backoff_seconds": 60})
    }
    policy = default_policy().model_copy(
        update={"guardrails": default_policy().guardrails.model_copy(update={"budgets": budgets})}
    )
    flap(engine, fault(), now=T0, policy=policy)
    second = flap(engine, fault(), now=T0 + timedelta(seconds=20), policy=policy)
    [row] = actions_of(engine, second.id)
    assert row.status == "pending" and row.not_before == T0 + timedelta(seconds=60)
    [d] = [d for t, d in timeline(engine, second.id) if t == "action_deferred"]
    assert "waits for its backoff until" in d["reason"]
    with Session(engine) as s:
        due = lambda at: [a.id for a in due_for_dispatch(s, now=at)]  # noqa: E731
        first_id = actions_of(engine, second.id - 1)[0].id
        assert due(T0 + timedelta(seconds=59)) == [first_id]
        assert due(T0 + timedelta(seconds=60)) == [first_id, row.id]
