"""The worker side of an action: claim, adapter under a kept lease, result recorded."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlmodel import Session

from app.actions import runner
from app.actions.errors import ActionError, TransientActionError
from app.actions.machine import ActionSnapshot, finish_action
from app.actions.runner import RetryLater, RunLimits, run_action
from app.models.action import RecoveryAction
from app.models.incident import Incident
from app.policy.plans import ActionName
from tests.unit.app.actions.conftest import plan, skip_step

pytestmark = pytest.mark.timeout(60)

LIMITS = RunLimits(lease_seconds=30, max_attempts=3, max_retries=8, retries=0)


def run(engine: Engine, aid: int, key: str, adapter: Any, **kw: Any) -> dict[str, Any]:
    return run_action(
        engine,
        action_id=aid,
        idempotency_key=key,
        worker=kw.pop("worker", "w1"),
        adapters={ActionName.SKIP_FAILED_STEP: adapter},
        limits=kw.pop("limits", LIMITS),
        **kw,
    )


def row(engine: Engine, aid: int) -> RecoveryAction:
    with Session(engine) as s:
        r = s.get(RecoveryAction, aid)
        assert r is not None
        return r


def failures(engine: Engine, aid: int) -> int:
    with Session(engine) as s:
        inc = s.get(Incident, row(engine, aid).incident_id)
        assert inc is not None
        return inc.recovery_failures


def test_success_is_recorded_and_a_redelivery_does_nothing(engine: Engine) -> None:
    [(aid, key)] = plan(engine, skip_step())
    calls: list[ActionSnapshot] = []

    def adapter(a: ActionSnapshot) -> dict[str, Any]:
        calls.append(a)
        return {"skipped": a.params["step"]}

    out = run(engine, aid, key, adapter)
    assert out == {
        "outcome": "succeeded",
        "recorded": True,
        "result": {"skipped": 3},
        "error": None,
    }
    assert row(engine, aid).status == "succeeded"
    assert run(engine, aid, key, adapter)["outcome"] == "done" and len(calls) == 1


def test_a_transient_error_gives_the_claim_back_and_asks_for_a_retry(engine: Engine) -> None:
    [(aid, key)] = plan(engine, skip_step())

    def locked(a: ActionSnapshot) -> dict[str, Any]:
        raise TransientActionError("control file locked")

    with pytest.raises(RetryLater) as later:
        run(engine, aid, key, locked, limits=RunLimits(30, 3, 8, retries=2))
    assert later.value.countdown == 4.0 and isinstance(later.value.cause, TransientActionError)
    r = row(engine, aid)
    assert (r.status, r.worker, r.error) == ("dispatched", None, "control file locked")


def test_a_callers_own_transient_error_is_retried_too(engine: Engine) -> None:
    [(aid, key)] = plan(engine, skip_step())

    class SoftLimit(Exception):
        pass

    def slow(a: ActionSnapshot) -> dict[str, Any]:
        raise SoftLimit("soft time limit")

    with pytest.raises(RetryLater):
        run(engine, aid, key, slow, transient=(SoftLimit,))


def test_out_of_retries_a_transient_error_is_a_failed_recovery(engine: Engine) -> None:
    [(aid, key)] = plan(engine, skip_step())

    def locked(a: ActionSnapshot) -> dict[str, Any]:
        raise TransientActionError("control file locked")

    out = run(engine, aid, key, locked, limits=RunLimits(30, 3, 8, retries=8))
    assert (
        out["outcome"] == "failed" and out["error"] == "TransientActionError: control file locked"
    )
    assert row(engine, aid).status == "failed" and failures(engine, aid) == 1


def test_a_permanent_error_is_recorded(engine: Engine) -> None:
    [(aid, key)] = plan(engine, skip_step())

    def refuses(a: ActionSnapshot) -> dict[str, Any]:
        raise ActionError("needs the failed step")

    assert run(engine, aid, key, refuses)["error"] == "needs the failed step"
    assert row(engine, aid).status == "failed" and failures(engine, aid) == 1


def test_an_action_without_an_adapter_fails(engine: Engine) -> None:
    [(aid, key)] = plan(engine, skip_step())
    out = run_action(
        engine, action_id=aid, idempotency_key=key, worker="w1", adapters={}, limits=LIMITS
    )
    assert out["error"] == "no adapter for action 'skip_failed_step'"


def test_a_crashing_adapter_is_recorded_not_hidden(engine: Engine) -> None:
    [(aid, key)] = plan(engine, skip_step())

    def crashes(a: ActionSnapshot) -> dict[str, Any]:
        raise KeyError("step")

    assert run(engine, aid, key, crashes)["error"] == "KeyError: 'step'"


def test_a_claim_held_by_a_live_worker_is_retried_after_its_lease(engine: Engine) -> None:
    [(aid, key)] = plan(engine, skip_step())
    started, release = threading.Event(), threading.Event()

    def holds(a: ActionSnapshot) -> dict[str, Any]:
        started.set()
        release.wait(10)
        return {}

    first = threading.Thread(target=run, args=(engine, aid, key, holds))
    first.start()
    try:
        assert started.wait(10)
        with pytest.raises(RetryLater) as later:
            run(engine, aid, key, holds, worker="w2")
        assert 20 < later.value.countdown <= 30 and later.value.cause is None
    finally:
        release.set()
        first.join(10)
    assert row(engine, aid).worker == "w1" and row(engine, aid).status == "succeeded"


def test_the_lease_is_renewed_while_the_adapter_runs(engine: Engine) -> None:
    [(aid, key)] = plan(engine, skip_step())
    seen: list[object] = []

    def long_running(a: ActionSnapshot) -> dict[str, Any]:
        first = row(engine, aid).lease_until
        deadline = time.monotonic() + 20
        while row(engine, aid).lease_until == first and time.monotonic() < deadline:
            time.sleep(0.05)
        seen.extend([first, row(engine, aid).lease_until])
        return {}

    run(engine, aid, key, long_running, limits=RunLimits(0.6, 3, 8, retries=0))
    first, renewed = seen
    assert renewed is not None and first is not None and renewed > first  # type: ignore[operator]
    assert row(engine, aid).status == "succeeded"


def test_the_result_is_recorded_through_a_database_outage(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    [(aid, key)] = plan(engine, skip_step())
    refusals = [OperationalError("UPDATE", {}, Exception("database is away"))] * 2

    def flaky_finish(session: Session, **kw: Any) -> bool:
        if refusals:
            raise refusals.pop()
        return finish_action(session, **kw)

    monkeypatch.setattr(runner, "finish_action", flaky_finish)
    assert run(engine, aid, key, lambda a: {"ok": 1})["recorded"] is True
    assert refusals == [] and row(engine, aid).status == "succeeded"


def test_recording_gives_up_after_its_deadline(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    def down(session: Session, **kw: Any) -> bool:
        raise OperationalError("UPDATE", {}, Exception("database is away"))

    monkeypatch.setattr(runner, "finish_action", down)
    with pytest.raises(OperationalError):
        runner.record_result(engine, 1, "w1", ok=True, result={}, error=None, deadline_seconds=0.2)
