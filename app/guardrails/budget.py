"""Restart budgets per (job, role) and (job, role, rank), and the backoff between actions on
one participant.

A participant that keeps failing after each automatic restart is not healed by a fourth one:
the budget turns the next attempt into a question for a person (the incident goes heavy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from app.guardrails.history import PastAction
from app.guardrails.window import backoff_until, describe_seconds, in_window
from app.policy.plans import ActionName, PlannedAction
from app.policy.policy_file import ActionBudget


@dataclass(frozen=True, slots=True)
class BudgetCheck:
    """``spent``: the reason the budget is spent (escalate); else ``wait_until``: the backoff
    still running (defer), or neither (run)."""

    spent: str | None = None
    wait_until: datetime | None = None


def participant_of(a: PlannedAction) -> str:
    """``role/rank`` as the timeline names it (``role`` alone when the plan names no rank)."""
    role = a.params.get("role") or "?"
    rank = a.params.get("rank")
    return f"{role}/{rank}" if rank is not None else str(role)


def check_budget(
    a: PlannedAction, budget: ActionBudget, past: Sequence[PastAction], *, now: datetime
) -> BudgetCheck:
    """Judge ``a`` against ``budget`` given ``past``: the automatic actions of its kind and job
    (the window is applied here)."""
    role, rank = a.params.get("role"), a.params.get("rank")
    same_role = [p.at for p in past if p.role == role]
    role_times = in_window(same_role, now=now, seconds=budget.window_seconds)
    rank_times = in_window(
        [p.at for p in past if p.role == role and p.rank == rank],
        now=now,
        seconds=budget.window_seconds,
    )
    window = describe_seconds(budget.window_seconds)
    kind = _kind_words(a)
    if rank is not None and len(rank_times) >= budget.per_rank:
        return BudgetCheck(
            spent=f"{kind} budget of {participant_of(a)} spent, {len(rank_times)} in {window}"
        )
    if len(role_times) >= budget.per_role:
        return BudgetCheck(
            spent=f"{kind} budget of role {role or '?'} spent, {len(role_times)} in {window}"
        )
    participant_times = rank_times if rank is not None else role_times
    return BudgetCheck(
        wait_until=backoff_until(participant_times, now=now, base_seconds=budget.backoff_seconds)
    )


def _kind_words(a: PlannedAction) -> str:
    # "restart budget" for restart_role (the wording operators use); the action's name otherwise.
    return "restart" if a.action is ActionName.RESTART_ROLE else a.action.value
