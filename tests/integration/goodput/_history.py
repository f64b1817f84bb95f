"""A job's history with known faults, built through the real app: the trainer's step reports
through ``POST /api/v1/ingest`` (with their own timestamps), the incidents through the same
service calls the policy engine, the Celery worker, the approvals API and the release API make
(with their ``now``), so that every figure of the ledger is known to the second.

Times are seconds after ``t0`` (a whole second, twenty minutes ago):

* job start: first report at -60 (step 0); steps every 10 s from 10 (step 1) to 200 (step 20).
* A, gpu_lost (medium): fault 204 (detection delay 6 s), opened 210, restart_role
  claimed 212, succeeded 230; the trainer restored step 18 at 230, trains 19 at 240 and 20 at
  250 again, and the new step 21 at 260; steps every 10 s up to 40 at 450.
* B, gpu_xid (medium, overlaps A): opened 215 (no delay known), its action succeeded 262.
* C, storage_unwritable (heavy): fault 455 (delay 5 s), opened 460 with enter_safe_mode and an
  approval for restore_checkpoint; SAFE_MODE entered 462; the approver rejects at 560; the job
  waits in SAFE_MODE until an approver asks for its release at 700; released 705; step 41 at
  720, then every 10 s up to 55 at 860.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.actions.machine import claim_action, finish_action
from app.incidents import approvals
from app.incidents.persist import persist_decisions
from app.incidents.safe_mode_release import release_job
from app.models import User
from app.models.action import RecoveryAction
from app.models.approval import Approval
from app.policy.engine import DecisionType, IncidentDecision
from app.policy.plans import ActionName, PlannedAction
from app.policy.policy_file import default_policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject, Tier
from tests.harness import Api, auth, batch

JOB, CALM = "grpo-ledger", "grpo-calm"


def start(ago: float = 1200) -> float:
    """``t0``: a whole second, ``ago`` seconds ago (the history ends at ``t0 + 860``)."""
    return float(math.floor(time.time() - ago))


def at(t0: float, s: float) -> datetime:
    return datetime.fromtimestamp(t0 + s, UTC)


def trainer_steps() -> list[tuple[float, int]]:
    out = [(-60.0, 0)] + [(10.0 * i, i) for i in range(1, 21)]
    out += [(230.0, 18), (240.0, 19), (250.0, 20)]
    out += [(260.0 + 10 * k, 21 + k) for k in range(20)]  # 21 at 260 ... 40 at 450
    out += [(720.0 + 10 * k, 41 + k) for k in range(15)]  # 41 at 720 ... 55 at 860
    return out


def step_reports(
    t0: float, *, job: str, steps: list[tuple[float, int]], nodes: tuple[str, str] = ("n0", "n1")
) -> list[tuple[str, list[dict[str, Any]]]]:
    """``(node, participants)`` per agent report: trainer ranks 0 and 1 on the first node, a
    rollout on the second, all at the trainer's step."""
    out = []
    for s, step in steps:
        for node, parts in (
            (nodes[0], [("trainer", 0), ("trainer", 1)]),
            (nodes[1], [("rollout", 0)]),
        ):
            out.append(
                (
                    node,
                    [
                        {
                            "job": job,
                            "role": role,
                            "rank": rank,
                            "phase": "TRAIN",
                            "step": step,
                            "ts": t0 + s,
                        }
                        for role, rank in parts
                    ],
                )
            )
    return out


def ingest_steps(api: Api, t0: float, *, job: str, steps: list[tuple[float, int]]) -> None:
    """Each report as an agent sends it, through ``POST /api/v1/ingest``."""
    tokens = {n: auth(api.node_token(n)) for n in ("n0", "n1")}
    seq = {"n0": 0, "n1": 0}
    for node, participants in step_reports(t0, job=job, steps=steps):
        seq[node] += 1
        body = batch(node, seq[node], agent=f"agent-{node}-{job}", n=1, participants=participants)
        r = api.client.post("/api/v1/ingest", json=body, headers=tokens[node])
        assert r.status_code == 200, r.text


def _open(
    session: Session,
    t0: float,
    *,
    kind: FaultKind,
    tier: Tier,
    opened: float,
    delay: float | None,
    actions: tuple[PlannedAction, ...],
    subject: Subject,
) -> int:
    since = None if delay is None else t0 + opened - delay
    signal = FaultSignal(
        kind=kind,
        subject=subject,
        evidence=Evidence(metric=None, detail=f"{kind.value} test"),
        suggested_tier=tier,
        detected_at=t0 + opened,
        since=since,
    )
    d = IncidentDecision(
        type=DecisionType.OPEN,
        key=signal.incident_key,
        kind=kind,
        subject=subject,
        tier=tier,
        at=t0 + opened,
        signal=signal,
        actions=actions,
    )
    out = persist_decisions(session, decisions=[d], policy=default_policy(), now=at(t0, opened))
    [inc_id] = out.opened
    return inc_id


def _run(session: Session, t0: float, action_id: int, *, claimed: float, done: float) -> None:
    row = session.get(RecoveryAction, action_id)
    assert row is not None
    claim = claim_action(
        session,
        action_id=action_id,
        idempotency_key=row.idempotency_key,
        worker="w",
        lease_seconds=600,
        now=at(t0, claimed),
    )
    assert claim.outcome.value == "claimed", claim
    assert finish_action(session, action_id=action_id, worker="w", ok=True, now=at(t0, done))


def _actions(session: Session, inc_id: int) -> dict[str, RecoveryAction]:
    rows = session.exec(select(RecoveryAction).where(RecoveryAction.incident_id == inc_id)).all()
    return {r.action: r for r in rows}


def build_incidents(
    engine: Engine, t0: float, *, approver: str = "alice", node: str = "n0"
) -> dict[str, int]:
    """Incidents A, B and C as the module docstring tells; returns their ids. ``approver``
    names an existing user with the approver role; ``node`` is the trainer's node."""
    with Session(engine) as s:
        # GPU-level kinds and a storage fault: kinds a server's own policy engine cannot open
        # from these reports (no GPU samples, no state-log counters).
        a = _open(
            s,
            t0,
            kind=FaultKind.GPU_LOST,
            tier=Tier.MEDIUM,
            opened=210,
            delay=6,
            subject=Subject(job=JOB, node=node, gpu="1"),
            actions=(
                PlannedAction(
                    ActionName.RESTART_ROLE, JOB, None, False, {"role": "trainer", "rank": 0}
                ),
            ),
        )
        s.commit()
        b = _open(
            s,
            t0,
            kind=FaultKind.GPU_XID,
            tier=Tier.MEDIUM,
            opened=215,
            delay=None,
            subject=Subject(job=JOB, node=node, gpu="0"),
            actions=(
                PlannedAction(
                    ActionName.RESTART_ROLE, JOB, None, False, {"role": "trainer", "rank": 1}
                ),
            ),
        )
        s.commit()
        _run(s, t0, _actions(s, a)["restart_role"].id, claimed=212, done=230)  # type: ignore[arg-type]
        s.commit()
        _run(s, t0, _actions(s, b)["restart_role"].id, claimed=240, done=262)  # type: ignore[arg-type]
        s.commit()
        c = _open(
            s,
            t0,
            kind=FaultKind.STORAGE_UNWRITABLE,
            tier=Tier.HEAVY,
            opened=460,
            delay=5,
            subject=Subject(job=JOB),
            actions=(
                PlannedAction(ActionName.ENTER_SAFE_MODE, JOB, node, False),
                PlannedAction(ActionName.RESTORE_CHECKPOINT, JOB, None, True),
            ),
        )
        s.commit()
        _run(s, t0, _actions(s, c)["enter_safe_mode"].id, claimed=461, done=462)  # type: ignore[arg-type]
        s.commit()
        user = s.exec(select(User).where(User.name == approver)).one()
        [appr] = s.exec(select(Approval).where(Approval.incident_id == c)).all()
        approvals.decide(
            s,
            approval_id=appr.id,
            user=user,
            approve=False,  # type: ignore[arg-type]
            comment="not a restore",
            now=at(t0, 560),
        )
        s.commit()
        released = release_job(s, job=JOB, user=user, comment="disk fixed", now=at(t0, 700))
        s.commit()
        [release] = released.actions
        _run(s, t0, release.id, claimed=702, done=705)
        s.commit()
    return {"A": a, "B": b, "C": c}
