"""Two people deciding the same thing at the same moment: exactly one wins, the other gets 409.

A probe of the embedded mode found approve and reject of one approval both answered 200 (a
rejected plan dispatched, an approved one cancelled, both decisions on the timeline), and two
admins able to disable each other at once: ``SELECT ... FOR UPDATE`` takes no lock on SQLite.
Every guarded transition now takes the write lock first (``app.core.db.begin_write``) on SQLite
and a row lock on PostgreSQL. These tests race real requests against real ``rlguard server``
processes: two threads against one server, and two server processes on one database; on
SQLite and PostgreSQL. Each race runs for several rows at once, so that a missing lock shows
(before the fix the SQLite rounds failed in most rows).
"""

from __future__ import annotations

import multiprocessing
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from sqlmodel import Session, col, select

from app.auth.users import create_user
from app.core import migrate
from app.core.db import make_engine
from app.models import Role, utcnow
from app.models.action import ActionStatus, RecoveryAction
from app.models.approval import Approval
from app.models.audit import AuditEvent
from app.models.guardrails import CircuitBreaker
from app.models.incident import Incident, IncidentEvent, IncidentEventType
from tests.harness import ServerProcess, auth, rlguard_env

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

ROWS = 8  # raced at once in each test


@dataclass
class Racers:
    """Two server URLs (one server twice, or two servers on one database) and the tokens."""

    urls: tuple[str, str]
    engine: sa.Engine
    tokens: dict[str, str]


@pytest.fixture(params=["threads", "processes"])
def racers(
    request: pytest.FixtureRequest,
    database_url: str,
    tmp_path: Path,
    server_factory: Callable[..., ServerProcess],
) -> Iterator[Racers]:
    env = rlguard_env(database_url, tmp_path / "data", RLGUARD_DEV="1")
    migrate.upgrade(database_url)
    engine = make_engine(database_url)
    tokens = {}
    with Session(engine) as s:
        for name, role in [
            ("ada", Role.admin),
            ("bob", Role.admin),
            ("ann", Role.approver),
            ("abe", Role.approver),
            ("oli", Role.operator),
            ("ola", Role.operator),
        ]:
            tokens[name] = create_user(s, name=name, role=role, actor="test")[1]
        s.commit()
    first = server_factory("server", env).start()
    second = server_factory("server", env).start() if request.param == "processes" else first
    try:
        yield Racers((first.url, second.url), engine, tokens)
    finally:
        engine.dispose()


def race(calls: list[Callable[[], httpx.Response]]) -> list[httpx.Response]:
    """Run every call at the same moment, one thread each; their responses in order."""
    barrier = threading.Barrier(len(calls))
    out: list[httpx.Response | BaseException] = [RuntimeError("no answer")] * len(calls)

    def run(i: int) -> None:
        try:
            barrier.wait(30)
            out[i] = calls[i]()
        except BaseException as e:  # handed back to the test below
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for r in out:
        if isinstance(r, BaseException):
            raise r
    return out  # type: ignore[return-value]


def post(url: str, path: str, token: str, body: dict | None = None) -> Callable[[], httpx.Response]:
    return lambda: httpx.post(url + path, headers=auth(token), json=body, timeout=60)


def one_won(pair: list[httpx.Response], what: str, *, loser_codes: tuple[int, ...] = (409,)) -> int:
    """The index of the one request that got 200; the other must be refused with a reason."""
    codes = [r.status_code for r in pair]
    assert codes.count(200) == 1, f"{what}: {codes} {[r.text for r in pair]}"
    loser = pair[1 - codes.index(200)]
    assert loser.status_code in loser_codes, f"{what}: {codes} {[r.text for r in pair]}"
    assert loser.json()["detail"], loser.text
    return codes.index(200)


def seed_approvals(engine: sa.Engine, n: int, first: int = 0) -> list[tuple[int, int, int]]:
    """``n`` heavy incidents, each waiting for approval of one action: (incident, approval, action)."""
    now, out = utcnow(), []
    with Session(engine) as s:
        for i in range(first, first + n):
            inc = Incident(
                key=f"storage_unwritable:job=race-{i}",
                open_key=f"storage_unwritable:job=race-{i}",
                kind="storage_unwritable",
                tier="heavy",
                subject={"job": f"race-{i}"},
                job=f"race-{i}",
                summary="state log not writable",
                safe_mode=True,
            )
            s.add(inc)
            s.flush()
            appr = Approval(
                incident_id=inc.id, summary="restore", expires_at=now + timedelta(hours=1)
            )
            s.add(appr)
            s.flush()
            act = RecoveryAction(
                incident_id=inc.id,
                approval_id=appr.id,
                idempotency_key=f"{inc.id}:restore_checkpoint",
                action="restore_checkpoint",
                job=f"race-{i}",
                queue="cluster",
                status=ActionStatus.pending_approval.value,
            )
            s.add(act)
            s.flush()
            out.append((inc.id, appr.id, act.id))
        s.commit()
    return out  # type: ignore[return-value]


def audit_rows(engine: sa.Engine, target: str, prefix: str) -> list[AuditEvent]:
    with Session(engine) as s:
        rows = s.exec(select(AuditEvent).where(AuditEvent.target == target)).all()
        return [r for r in rows if r.action.startswith(prefix)]


def events(engine: sa.Engine, incident_id: int, *types: IncidentEventType) -> list[IncidentEvent]:
    with Session(engine) as s:
        return list(
            s.exec(
                select(IncidentEvent).where(
                    IncidentEvent.incident_id == incident_id,
                    col(IncidentEvent.type).in_([t.value for t in types]),
                )
            ).all()
        )


def test_approve_and_reject_at_once_one_decision(racers: Racers) -> None:
    seeded = seed_approvals(racers.engine, ROWS)
    a, b = racers.urls
    for inc_id, appr_id, act_id in seeded:
        pair = race(
            [
                post(a, f"/api/v1/approvals/{appr_id}/approve", racers.tokens["ann"]),
                post(b, f"/api/v1/approvals/{appr_id}/reject", racers.tokens["abe"]),
            ]
        )
        approved = one_won(pair, f"approval {appr_id}") == 0
        with Session(racers.engine) as s:
            appr = s.get(Approval, appr_id)
            act = s.get(RecoveryAction, act_id)
            assert appr is not None and act is not None
            assert appr.status == ("approved" if approved else "rejected")
            assert appr.decided_by == ("ann" if approved else "abe")
            # The action follows the decision that won, never the one that lost.
            if approved:
                assert act.status != ActionStatus.cancelled.value, act.error
            else:
                assert act.status == ActionStatus.cancelled.value
        decided = events(
            racers.engine,
            inc_id,
            IncidentEventType.APPROVAL_GRANTED,
            IncidentEventType.APPROVAL_REJECTED,
        )
        assert len(decided) == 1, [e.type for e in decided]
        assert len(audit_rows(racers.engine, f"approval:{appr_id}", "approval.")) == 1


def test_two_approvers_approving_at_once_one_decision(racers: Racers) -> None:
    seeded = seed_approvals(racers.engine, ROWS // 2)
    a, b = racers.urls
    for inc_id, appr_id, _act_id in seeded:
        pair = race(
            [
                post(a, f"/api/v1/approvals/{appr_id}/approve", racers.tokens["ann"]),
                post(b, f"/api/v1/approvals/{appr_id}/approve", racers.tokens["abe"]),
            ]
        )
        one_won(pair, f"approval {appr_id}")
        assert len(events(racers.engine, inc_id, IncidentEventType.APPROVAL_GRANTED)) == 1
        assert len(audit_rows(racers.engine, f"approval:{appr_id}", "approval.")) == 1


def test_two_admins_disabling_each_other_leave_one_enabled_admin(racers: Racers) -> None:
    a, b = racers.urls
    for round_ in range(ROWS):
        pair = race(
            [
                post(a, "/api/v1/users/bob/disable", racers.tokens["ada"]),
                post(b, "/api/v1/users/ada/disable", racers.tokens["bob"]),
            ]
        )
        # The loser is refused as the last admin (409), or, when the winner committed before
        # the loser's request was authenticated, as a disabled user (401).
        winner = one_won(pair, f"round {round_}", loser_codes=(409, 401))
        with racers.engine.begin() as conn:
            enabled = (
                conn.execute(
                    sa.text("SELECT name FROM user_account WHERE role = 'admin' AND NOT disabled")
                )
                .scalars()
                .all()
            )
            assert enabled == [["ada", "bob"][winner]], enabled
            assert (
                conn.execute(
                    sa.text("SELECT count(*) FROM audit_event WHERE action = 'user.disable'")
                ).scalar_one()
                == round_ + 1
            )
            conn.execute(sa.text("UPDATE user_account SET disabled = false"))  # next round


def test_expiring_one_silence_twice_at_once(racers: Racers) -> None:
    a, b = racers.urls
    ids = []
    for i in range(ROWS):
        made = httpx.post(
            a + "/api/v1/silences",
            headers=auth(racers.tokens["oli"]),
            json={
                "matchers": [{"label": "job", "value": f"race-{i}"}],
                "duration_minutes": 60,
                "comment": "racing",
            },
            timeout=30,
        )
        assert made.status_code == 201, made.text
        ids.append(made.json()["id"])
    for sid in ids:
        pair = race(
            [
                post(a, f"/api/v1/silences/{sid}/expire", racers.tokens["oli"]),
                post(b, f"/api/v1/silences/{sid}/expire", racers.tokens["ola"]),
            ]
        )
        one_won(pair, f"silence {sid}")
        assert len(audit_rows(racers.engine, f"silence:{sid}", "silence.expire")) == 1


def test_resetting_one_breaker_twice_at_once(racers: Racers) -> None:
    a, b = racers.urls
    seeded = seed_approvals(racers.engine, ROWS)  # incidents for the breakers to name
    with Session(racers.engine) as s:
        for i, (inc_id, _a, _b) in enumerate(seeded):
            s.add(
                CircuitBreaker(
                    scope=f"job:race-{i}",
                    open=True,
                    tripped_at=utcnow(),
                    reason="storm",
                    incident_id=inc_id,
                    trips=1,
                )
            )
        s.commit()
    for i, (inc_id, _a, _b) in enumerate(seeded):
        pair = race(
            [
                post(a, f"/api/v1/breakers/job:race-{i}/reset", racers.tokens["ann"]),
                post(b, f"/api/v1/breakers/job:race-{i}/reset", racers.tokens["abe"]),
            ]
        )
        one_won(pair, f"breaker job:race-{i}")
        assert len(audit_rows(racers.engine, f"job:race-{i}", "breaker.reset")) == 1
        assert len(events(racers.engine, inc_id, IncidentEventType.BREAKER_RESET)) == 1


def _claim(url: str, action_id: int, key: str, worker: str, start: object, out: object) -> None:
    """In a process of its own: claim an action as a worker does, say what came of it."""
    from app.actions.machine import claim_action
    from app.core.db import session_scope

    engine = make_engine(url)
    try:
        start.wait(30)  # type: ignore[attr-defined]
        with session_scope(engine) as s:
            claim = claim_action(
                s, action_id=action_id, idempotency_key=key, worker=worker, lease_seconds=60
            )
        out.put((worker, claim.outcome.value))  # type: ignore[attr-defined]
    except BaseException:
        out.put((worker, traceback.format_exc()))  # type: ignore[attr-defined]
    finally:
        engine.dispose()


def test_two_workers_claiming_one_action_at_once(database_url: str) -> None:
    """Two worker processes claim the same delivered action: one runs it, one event says so."""
    migrate.upgrade(database_url)
    engine = make_engine(database_url)
    seeded = seed_approvals(engine, ROWS)
    with Session(engine) as s:
        for _inc, _appr, act_id in seeded:
            act = s.get(RecoveryAction, act_id)
            assert act is not None
            act.status, act.approval_id = ActionStatus.dispatched.value, None
        s.commit()
    ctx = multiprocessing.get_context("spawn")  # no inherited engine or threads
    for inc_id, _appr, act_id in seeded:
        start, out = ctx.Barrier(2), ctx.Queue()
        procs = [
            ctx.Process(
                target=_claim,
                args=(database_url, act_id, f"{inc_id}:restore_checkpoint", w, start, out),
            )
            for w in ("w1", "w2")
        ]
        for p in procs:
            p.start()
        got = dict(out.get(timeout=90) for _ in procs)
        for p in procs:
            p.join(30)
        assert sorted(got.values()) == ["busy", "claimed"], got
        started = events(engine, inc_id, IncidentEventType.ACTION_STARTED)
        winner = next(w for w, outcome in got.items() if outcome == "claimed")
        assert len(started) == 1 and started[0].actor == f"worker:{winner}"
    engine.dispose()


def _expire_all(url: str, at: float, start: object, out: object) -> None:
    """In a process of its own: the scheduler's expiry pass, as of ``at``."""
    from datetime import UTC, datetime

    from app.core.db import session_scope
    from app.incidents.approvals import expire_approvals

    engine = make_engine(url)
    try:
        start.wait(30)  # type: ignore[attr-defined]
        with session_scope(engine) as s:
            out.put(expire_approvals(s, now=datetime.fromtimestamp(at, UTC)))  # type: ignore[attr-defined]
    except BaseException:
        out.put(traceback.format_exc())  # type: ignore[attr-defined]
    finally:
        engine.dispose()


def test_approving_while_the_expiry_pass_runs_one_decision(racers: Racers) -> None:
    """An approver deciding at the moment the scheduler expires the approval: it is either
    approved (and the pass leaves it) or expired (and the approver gets 409), never both."""
    ctx = multiprocessing.get_context("spawn")
    url = str(racers.engine.url.render_as_string(hide_password=False))
    for i in range(ROWS // 2):
        # One pending approval at a time: the pass expires every approval past its deadline.
        [(inc_id, appr_id, act_id)] = seed_approvals(racers.engine, 1, first=i)
        later = (utcnow() + timedelta(hours=2)).timestamp()  # past its deadline
        start, out = ctx.Barrier(2), ctx.Queue()
        proc = ctx.Process(target=_expire_all, args=(url, later, start, out))
        proc.start()
        start.wait(30)
        r = httpx.post(
            racers.urls[0] + f"/api/v1/approvals/{appr_id}/approve",
            headers=auth(racers.tokens["ann"]),
            timeout=60,
        )
        expired = out.get(timeout=90)
        proc.join(30)
        assert isinstance(expired, int), expired
        assert r.status_code in (200, 409), r.text
        with Session(racers.engine) as s:
            appr, act = s.get(Approval, appr_id), s.get(RecoveryAction, act_id)
            assert appr is not None and act is not None
            if r.status_code == 200:
                assert (appr.status, expired) == ("approved", 0)
                assert act.status != ActionStatus.cancelled.value
            else:
                assert (appr.status, expired) == ("expired", 1)
                assert act.status == ActionStatus.cancelled.value
        decided = events(
            racers.engine,
            inc_id,
            IncidentEventType.APPROVAL_GRANTED,
            IncidentEventType.APPROVAL_EXPIRED,
        )
        assert len(decided) == 1, [e.type for e in decided]
