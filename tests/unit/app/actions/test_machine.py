"""The action state machine: claim, lease, renewal, finish (``app.actions.machine``)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.actions import machine as actions
from app.actions import outbox
from app.models._types import utcnow
from app.policy.plans import ActionName, PlannedAction
from tests.unit.app.actions.conftest import plan

pytestmark = pytest.mark.timeout(60)


def test_claim_is_exclusive_and_redelivery_is_a_noop(engine: Engine) -> None:
    skip = PlannedAction(ActionName.SKIP_FAILED_STEP, "j", "n0", False, {"step": 3})
    [(aid, key)] = plan(engine, skip)
    with Session(engine) as s:
        assert (
            actions.claim_action(
                s, action_id=aid, idempotency_key="wrong", worker="w1", lease_seconds=30
            ).outcome
            is actions.ClaimOutcome.unknown
        )
        c1 = actions.claim_action(
            s, action_id=aid, idempotency_key=key, worker="w1", lease_seconds=30
        )
        s.commit()
        c2 = actions.claim_action(
            s, action_id=aid, idempotency_key=key, worker="w2", lease_seconds=30
        )
        s.commit()
    assert c1.outcome is actions.ClaimOutcome.claimed and c1.action.attempts == 1
    assert c2.outcome is actions.ClaimOutcome.busy and c2.retry_in > 20
    with Session(engine) as s:
        assert not actions.finish_action(s, action_id=aid, worker="w2", ok=True)  # not the holder
        assert actions.finish_action(s, action_id=aid, worker="w1", ok=True, result={"x": 1})
        s.commit()
        c3 = actions.claim_action(
            s, action_id=aid, idempotency_key=key, worker="w3", lease_seconds=30
        )
    assert c3.outcome is actions.ClaimOutcome.done


def test_expired_lease_is_taken_over_and_redispatched(engine: Engine) -> None:
    act = PlannedAction(ActionName.RESTART_ROLE, "j", "n0", False, {"role": "trainer", "rank": 0})
    [(aid, key)] = plan(engine, act)
    t0 = utcnow()
    with Session(engine) as s:
        assert [d.id for d in outbox.due_for_dispatch(s, now=t0)] == [aid]
        outbox.mark_dispatched(s, action_id=aid, now=t0)
        actions.claim_action(
            s, action_id=aid, idempotency_key=key, worker="dead", lease_seconds=5, now=t0
        )
        s.commit()
        assert outbox.due_for_dispatch(s, now=t0 + timedelta(seconds=4), redispatch_after=3) == []
        assert [
            d.id
            for d in outbox.due_for_dispatch(s, now=t0 + timedelta(seconds=6), redispatch_after=3)
        ] == [aid]
        c = actions.claim_action(
            s,
            action_id=aid,
            idempotency_key=key,
            worker="new",
            lease_seconds=5,
            now=t0 + timedelta(seconds=6),
        )
        s.commit()
    assert c.outcome is actions.ClaimOutcome.claimed and c.action.attempts == 2


def test_renewed_lease_keeps_a_slow_action_from_being_taken_over(engine: Engine) -> None:
    skip = PlannedAction(ActionName.SKIP_FAILED_STEP, "j", "n0", False, {"step": 5})
    [(aid, key)] = plan(engine, skip)
    t0 = utcnow()
    with Session(engine) as s:
        actions.claim_action(
            s, action_id=aid, idempotency_key=key, worker="slow", lease_seconds=5, now=t0
        )
        s.commit()
        # The holder renews at t0+4 s: at t0+6 s the action is still its own.
        assert actions.renew_action_lease(
            s, action_id=aid, worker="slow", lease_seconds=5, now=t0 + timedelta(seconds=4)
        )
        s.commit()
        assert outbox.due_for_dispatch(s, now=t0 + timedelta(seconds=6), redispatch_after=3) == []
        c = actions.claim_action(
            s,
            action_id=aid,
            idempotency_key=key,
            worker="other",
            lease_seconds=5,
            now=t0 + timedelta(seconds=6),
        )
        s.commit()
        assert c.outcome is actions.ClaimOutcome.busy
        # Another worker cannot renew a lease it does not hold.
        assert not actions.renew_action_lease(
            s, action_id=aid, worker="other", lease_seconds=5, now=t0 + timedelta(seconds=7)
        )
        assert actions.finish_action(
            s, action_id=aid, worker="slow", ok=True, result={}, now=t0 + timedelta(seconds=8)
        )
        s.commit()
        # Once finished there is nothing left to renew.
        assert not actions.renew_action_lease(s, action_id=aid, worker="slow", lease_seconds=5)
