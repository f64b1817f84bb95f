"""The gate between a recovery plan and the outbox: what of a plan may run, and why not.

Called once per plan by the incident writer (``app.incidents.persist``), in its transaction,
before any action row is written; the writer records every verdict that is not a plain "run" on
the incident's timeline. Checks, in order, for each action:

1. dry run (the setting, or the job's switch): the row is written as ``dry_run``, never sent;
2. hands off (the job's switch): an automatic action is not written;
3. the scope's open breaker: an automatic action is not written;
4. the restart budget of its kind: spent, the action waits for an approver (heavy);
5. the breaker's limits: this action would cross them, so the breaker trips, and the action
   waits for an approver (the one heavy incident that says why);
6. the backoff on its participant: the row is written but not sent before the backoff ends.

Actions that need an approval anyway pass 2-6: a person decides those.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from sqlmodel import Session

from app.guardrails import breaker
from app.guardrails.automation import switches_of
from app.guardrails.budget import check_budget, participant_of
from app.guardrails.history import PastAction, automatic_since
from app.guardrails.window import window_start
from app.policy.plans import PlannedAction
from app.policy.policy_file import Guardrails


class Verdict(enum.StrEnum):
    RUN = "run"
    DEFER = "defer"  # runs once the backoff ends (``not_before``)
    ESCALATE = "escalate"  # waits for an approver: a budget is spent or a breaker tripped now
    DRY_RUN = "dry_run"
    BLOCKED = "blocked"  # the scope's breaker is open
    PAUSED = "paused"  # the job is hands off


@dataclass(frozen=True, slots=True)
class GateDecision:
    """What becomes of one planned action. ``action`` is what to write (for ESCALATE: the same
    action, now waiting for an approval); ``written`` says whether a row is written at all."""

    verdict: Verdict
    action: PlannedAction
    reason: str = ""
    not_before: datetime | None = None
    tripped: str | None = None  # the breaker scope this action tripped

    @property
    def written(self) -> bool:
        return self.verdict not in (Verdict.BLOCKED, Verdict.PAUSED)


def gate(
    session: Session,
    *,
    actions: Sequence[PlannedAction],
    rails: Guardrails,
    now: datetime,
    incident_id: int | None,
    dry_run: bool = False,
) -> list[GateDecision]:
    """One decision per action of the plan, in order. ``dry_run`` is the global setting. May
    trip breakers (their rows are written in the caller's transaction)."""
    planned: list[PastAction] = []  # this plan's automatic actions judged to run, in order
    out = []
    for a in actions:
        d = _judge(session, a, rails, now, incident_id, dry_run, planned)
        if d.verdict in (Verdict.RUN, Verdict.DEFER) and not d.action.needs_approval:
            planned.append(_as_past(a, now))
        out.append(d)
    return out


def _judge(
    session: Session,
    a: PlannedAction,
    rails: Guardrails,
    now: datetime,
    incident_id: int | None,
    dry_run: bool,
    planned: list[PastAction],
) -> GateDecision:
    switches = switches_of(session, a.job)
    if dry_run or switches.dry_run:
        where = "the setting" if dry_run else f"job {a.job}"
        return GateDecision(
            Verdict.DRY_RUN, a, f"dry run ({where}): would run {a.action.value} on {_target(a)}"
        )
    if a.needs_approval:
        return GateDecision(Verdict.RUN, a)
    if switches.hands_off:
        return GateDecision(
            Verdict.PAUSED,
            a,
            f"not run: automation of job {a.job} is paused (hands off); "
            f"{a.action.value} on {_target(a)}",
        )
    for scope in breaker.scopes_of(a):
        row = breaker.get_breaker(session, scope)
        if row is not None and row.open:
            return GateDecision(Verdict.BLOCKED, a, f"not run: {breaker.open_reason(row)}")
    budget = rails.budgets.get(a.action)
    check = None
    if budget is not None:
        since = window_start(now, budget.window_seconds)
        past = automatic_since(session, since=since, job=a.job, action=a.action.value)
        past += [p for p in planned if p.action == a.action.value and p.job == a.job]
        check = check_budget(a, budget, past, now=now)
        if check.spent is not None:
            return GateDecision(
                Verdict.ESCALATE, replace(a, needs_approval=True), f"not run: {check.spent}"
            )
    for scope in breaker.scopes_of(a):
        t = breaker.would_trip(
            session, scope, rails, now=now, planned=planned, candidate=_as_past(a, now)
        )
        if t is not None:
            breaker.trip(session, t, incident_id=incident_id, now=now)
            return GateDecision(
                Verdict.ESCALATE,
                replace(a, needs_approval=True),
                f"not run: circuit breaker {t.scope} tripped, {t.reason}; automation stops "
                "for it until an approver resets it",
                tripped=t.scope,
            )
    if check is not None and check.wait_until is not None:
        return GateDecision(
            Verdict.DEFER,
            a,
            f"deferred: {a.action.value} on {_target(a)} waits for its backoff until "
            f"{check.wait_until.isoformat(timespec='seconds')}",
            not_before=check.wait_until,
        )
    return GateDecision(Verdict.RUN, a)


def _target(a: PlannedAction) -> str:
    parts = [f"job {a.job}" if a.job else "", participant_of(a) if a.params.get("role") else ""]
    parts.append(f"node {a.node}" if a.node else "")
    return ", ".join(p for p in parts if p) or "the cluster"


def _as_past(a: PlannedAction, now: datetime) -> PastAction:
    return PastAction(
        action=a.action.value,
        job=a.job,
        node=a.node,
        role=a.params.get("role"),
        rank=a.params.get("rank"),
        at=now,
    )
