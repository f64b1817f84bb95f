"""Restart budgets per rank and per role, and backoff on one participant (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from app.guardrails.budget import check_budget
from app.guardrails.history import PastAction
from app.policy.plans import ActionName, PlannedAction
from app.policy.policy_file import ActionBudget

T0 = datetime(2026, 12, 2, 4, 0, tzinfo=UTC)
BUDGET = ActionBudget(per_rank=3, per_role=4, window_seconds=1800, backoff_seconds=0)


def restart(rank: int, role: str = "rollout") -> PlannedAction:
    return PlannedAction(ActionName.RESTART_ROLE, "j", "n1", False, {"role": role, "rank": rank})


def past(rank: int, minutes_ago: float, role: str = "rollout") -> PastAction:
    return PastAction("restart_role", "j", "n1", role, rank, T0 - timedelta(minutes=minutes_ago))


def test_the_fourth_restart_of_one_rank_in_the_window_is_over_budget() -> None:
    two = [past(1, 20), past(1, 10)]
    assert check_budget(restart(1), BUDGET, two, now=T0).spent is None
    three = [*two, past(1, 1)]
    assert check_budget(restart(1), BUDGET, three, now=T0).spent == (
        "restart budget of rollout/1 spent, 3 in 30 min"
    )
    # another rank and another role have budgets of their own
    assert check_budget(restart(2), BUDGET, three, now=T0).spent is None
    assert check_budget(restart(1, "trainer"), BUDGET, three, now=T0).spent is None


def test_restarts_that_left_the_window_are_not_counted() -> None:
    old = [past(1, 45), past(1, 40), past(1, 31)]
    assert check_budget(restart(1), BUDGET, old, now=T0).spent is None


def test_the_role_budget_counts_every_rank_of_the_role() -> None:
    spread = [past(0, 5), past(1, 4), past(2, 3), past(3, 2)]
    assert check_budget(restart(4), BUDGET, spread, now=T0).spent == (
        "restart budget of role rollout spent, 4 in 30 min"
    )


def test_backoff_defers_the_next_restart_of_the_same_participant() -> None:
    b = BUDGET.model_copy(update={"backoff_seconds": 60})
    one = [past(1, 0.5)]  # 30 s ago: the second restart waits 60 s after the first
    assert check_budget(restart(1), b, one, now=T0).wait_until == T0 + timedelta(seconds=30)
    assert check_budget(restart(2), b, one, now=T0).wait_until is None  # another participant
    two = [past(1, 3), past(1, 1)]  # the third waits 120 s after the second: 60 s left
    assert check_budget(restart(1), b, two, now=T0).wait_until == T0 + timedelta(seconds=60)
