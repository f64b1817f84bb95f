"""Releasing a job that only its control file holds in SAFE_MODE (no open incident).

The server knows such a job from the participants' phase that ingest stores: the job's phase
machine obeys the control file and every heartbeat carries its phase. Through the REST API of
an in-process app on SQLite and PostgreSQL (participants reported only through
``POST /api/v1/ingest``): the release opens a ``safe_mode_hold`` incident, plans one
``release_safe_mode`` action per held node, is audited, and closes once the node workers
(played here through the same claim/finish calls a worker makes) report success. Refusals
(not held, unknown job, roles, bad comments, a release on its way, an incident still entering
SAFE_MODE) change nothing. The last test runs a real worker process that clears the control
file that a real PhaseMachine obeys.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, func, select

from app.actions import machine as actions
from app.core import migrate
from app.incidents.persist import persist_decisions
from app.main import create_app
from app.models import AuditEvent, Role
from app.models.action import RecoveryAction
from app.models.incident import Incident
from app.policy.engine import DecisionType, IncidentDecision
from app.policy.plans import ActionName, PlannedAction
from app.policy.policy_file import default_policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject, Tier
from app.tasks.recovery_adapters import read_mode
from recovery.control import ControlMode, write_control
from recovery.phases import Phase, PhaseMachine
from recovery.statelog import StateLog
from tests.harness import Api, AppClient, auth, make_settings
from tests.harness.stack import Stack

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(150)]

HELD, CALM = "grpo-held", "grpo-calm"


class Rest:
    """An in-process app without the policy scheduler (actions stay planned until the test
    plays the worker), plus tokens for each role and an ingest helper."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.client = api.client
        self.engine = api.engine
        self.tokens = {role: api.user_token(role.value, role) for role in Role}
        self.node_tokens: dict[str, str] = {}
        self._seq = itertools.count()

    def heartbeat(self, node: str, *parts: tuple[str, str, int, str]) -> None:
        """Participants ``(job, role, rank, phase)`` reported by ``node``'s agent, now."""
        if node not in self.node_tokens:
            self.node_tokens[node] = self.api.node_token(node)
        now = time.time()
        body = {
            "agent_id": f"agent-{node}",
            "node": node,
            "seq": next(self._seq),
            "sent_at": now,
            "samples": [],
            "participants": [
                {"job": j, "role": r, "rank": k, "phase": ph, "step": 7, "ts": now}
                for j, r, k, ph in parts
            ],
        }
        r = self.client.post("/api/v1/ingest", json=body, headers=auth(self.node_tokens[node]))
        assert r.status_code == 200, r.text

    def release(self, job: str, role: Role | None = Role.approver, **body: Any) -> Any:
        headers = auth(self.tokens[role]) if role is not None else {}
        return self.client.post(f"/api/v1/jobs/{job}/release", json=body, headers=headers)

    def incident(self, incident_id: int) -> dict[str, Any]:
        r = self.client.get(
            f"/api/v1/incidents/{incident_id}", headers=auth(self.tokens[Role.viewer])
        )
        assert r.status_code == 200, r.text
        return r.json()

    def counts(self) -> tuple[int, int, int]:
        with Session(self.engine) as s:
            return (
                s.exec(select(func.count()).select_from(Incident)).one(),
                s.exec(select(func.count()).select_from(RecoveryAction)).one(),
                s.exec(
                    select(func.count())
                    .select_from(AuditEvent)
                    .where(AuditEvent.action == "job.release")
                ).one(),
            )

    def run_action(self, action_id: int, *, ok: bool = True, error: str | None = None) -> None:
        """What the node worker records around the adapter: claim, then the outcome."""
        with Session(self.engine) as s:
            key = s.get(RecoveryAction, action_id).idempotency_key  # type: ignore[union-attr]
            claim = actions.claim_action(
                s, action_id=action_id, idempotency_key=key, worker="w1", lease_seconds=30
            )
            assert claim.outcome is actions.ClaimOutcome.claimed, claim
            assert actions.finish_action(s, action_id=action_id, worker="w1", ok=ok, error=error)
            s.commit()


@pytest.fixture
def rest(database_url: str, tmp_path: Path) -> Iterator[Rest]:
    migrate.upgrade(database_url)
    client = AppClient(
        create_app(make_settings(database_url, tmp_path / "data"), extra_lifespans=[])
    )
    try:
        r = Rest(Api(client))
        # HELD: the control file says SAFE_MODE on both nodes (an operator wrote it); CALM runs.
        r.heartbeat("n0", (HELD, "trainer", 0, "SAFE_MODE"), (CALM, "trainer", 0, "TRAIN"))
        r.heartbeat(
            "n1",
            (HELD, "rollout", 0, "SAFE_MODE"),
            (HELD, "rollout", 1, "SAFE_MODE"),
            (CALM, "rollout", 0, "ROLLOUT"),
            (CALM, "rollout", 1, "TRAIN"),
        )
        yield r
    finally:
        client.close()


def test_a_job_held_only_by_its_control_file_is_released_audited_and_closed(rest: Rest) -> None:
    before = rest.counts()
    r = rest.release(HELD, comment="  operator left it in SAFE_MODE; disks checked  ")
    assert r.status_code == 202, r.text
    body = r.json()
    assert (body["job"], body["released_by"], body["comment"]) == (
        HELD,
        "approver",
        "operator left it in SAFE_MODE; disks checked",
    )
    [incident_id] = body["incidents"]
    planned = sorted((a["node"], a["queue"], a["action"], a["status"]) for a in body["actions"])
    assert planned == [
        ("n0", "node.n0", "release_safe_mode", "pending"),
        ("n1", "node.n1", "release_safe_mode", "pending"),
    ]
    assert all(
        a["idempotency_key"].startswith(f"inc{incident_id}/release1/") for a in body["actions"]
    )
    assert rest.counts() == (before[0] + 1, before[1] + 2, before[2] + 1)

    inc = rest.incident(incident_id)
    assert (inc["kind"], inc["job"], inc["status"], inc["safe_mode"]) == (
        "safe_mode_hold",
        HELD,
        "open",
        True,
    )
    assert inc["evidence"]["nodes"] == ["n0", "n1"]
    assert sorted((p["role"], p["rank"], p["node"]) for p in inc["evidence"]["participants"]) == [
        ("rollout", 0, "n1"),
        ("rollout", 1, "n1"),
        ("trainer", 0, "n0"),
    ]
    requested = inc["timeline"][-1]
    assert (requested["type"], requested["actor"]) == ("release_requested", "user:approver")
    assert requested["detail"]["nodes"] == ["n0", "n1"]
    with Session(rest.engine) as s:
        audit = s.exec(select(AuditEvent).where(AuditEvent.action == "job.release")).one()
    assert (audit.actor, audit.target) == ("user:approver", f"job:{HELD}")
    assert audit.detail["incidents"] == [incident_id] and audit.detail["control_file_hold"] is True
    assert audit.detail["comment"] == "operator left it in SAFE_MODE; disks checked"

    # On its way: a second release is refused and adds nothing.
    mid = rest.counts()
    r = rest.release(HELD, Role.admin, comment="again")
    assert r.status_code == 409 and "already on its way" in r.json()["detail"], r.text
    assert rest.counts() == mid

    first, second = body["actions"]
    rest.run_action(first["id"])
    assert rest.incident(incident_id)["status"] == "open"  # not before every node confirmed
    rest.run_action(second["id"])
    done = rest.incident(incident_id)
    assert (done["status"], done["safe_mode"]) == ("resolved", False)
    released = next(e for e in done["timeline"] if e["type"] == "safe_mode_released")
    assert released["actor"] == "user:approver"
    assert (done["timeline"][-1]["type"], done["timeline"][-1]["actor"]) == (
        "resolved",
        "user:approver",
    )

    # The phases in the table were reported before the release finished: not held any more.
    r = rest.release(HELD, comment="once more")
    assert r.status_code == 409, r.text
    detail = r.json()["detail"]
    assert f"job '{HELD}' is not in SAFE_MODE" in detail and "last release finished at" in detail
    assert rest.counts() == mid

    # Put back in SAFE_MODE later (a heartbeat reports it again): a new release, a new incident.
    rest.heartbeat("n0", (HELD, "trainer", 0, "SAFE_MODE"))
    r = rest.release(HELD, comment="held again by hand")
    assert r.status_code == 202, r.text
    [again] = r.json()["incidents"]
    assert again != incident_id
    assert [a["node"] for a in r.json()["actions"]] == ["n0"]


def test_a_failed_release_keeps_the_hold_and_is_retried_on_the_same_nodes(rest: Rest) -> None:
    r = rest.release(HELD, comment="try")
    assert r.status_code == 202, r.text
    [incident_id] = r.json()["incidents"]
    a0, a1 = r.json()["actions"]
    rest.run_action(a0["id"])
    rest.run_action(a1["id"], ok=False, error="control file locked")
    inc = rest.incident(incident_id)
    assert (inc["status"], inc["safe_mode"]) == ("open", True)
    with Session(rest.engine) as s:
        assert s.get(Incident, incident_id).recovery_failures == 0  # type: ignore[union-attr]

    retry = rest.release(HELD, comment="retry")
    assert retry.status_code == 202, retry.text
    assert retry.json()["incidents"] == [incident_id]
    keys = sorted(a["idempotency_key"] for a in retry.json()["actions"])
    assert keys == [f"inc{incident_id}/release2/n0", f"inc{incident_id}/release2/n1"]
    for a in retry.json()["actions"]:
        rest.run_action(a["id"])
    assert rest.incident(incident_id)["status"] == "resolved"


@pytest.mark.parametrize(
    ("job", "role", "body", "status", "message"),
    [
        (
            CALM,
            Role.approver,
            {"comment": "run"},
            409,
            f"job '{CALM}' is not in SAFE_MODE: no open incident holds it there and none of its participants "
            "reports phase SAFE_MODE (its participants report 1× ROLLOUT, 2× TRAIN)",
        ),
        ("no-such-job", Role.approver, {"comment": "run"}, 404, "no job named 'no-such-job'"),
        (HELD, Role.viewer, {"comment": "run"}, 403, "needs the approver role; viewer is viewer"),
        (
            HELD,
            Role.operator,
            {"comment": "run"},
            403,
            "needs the approver role; operator is operator",
        ),
        (HELD, None, {"comment": "run"}, 401, ""),
        (HELD, Role.approver, {}, 422, "comment"),
        (HELD, Role.approver, {"comment": "   "}, 422, "comment must say why"),
        (HELD, Role.approver, {"comment": 5}, 422, "comment"),
        (
            HELD,
            Role.approver,
            {"comment": "x" * 2001},
            422,
            "comment is 2001 characters; at most 2000",
        ),
    ],
)
def test_bad_release_requests_are_refused_with_a_reason_and_change_nothing(
    rest: Rest, job: str, role: Role | None, body: dict[str, Any], status: int, message: str
) -> None:
    before = rest.counts()
    r = rest.release(job, role, **body)
    assert r.status_code == status, r.text
    assert message in r.text
    assert rest.counts() == before


def test_a_job_with_no_participants_is_not_held(rest: Rest) -> None:
    from app.models.cluster import Job

    with Session(rest.engine) as s:
        s.add(Job(name="empty"))
        s.commit()
    r = rest.release("empty", comment="run")
    assert r.status_code == 409 and "(it has no participants)" in r.json()["detail"], r.text


def test_an_incident_still_entering_safe_mode_is_decided_first(rest: Rest) -> None:
    """A heavy incident whose enter_safe_mode has not finished: the participants may already
    report SAFE_MODE, but releasing now would undo what its approver has not seen yet."""
    subject = Subject(node="n0", job=HELD, role="trainer", rank=0)
    sig = FaultSignal(
        FaultKind.STORAGE_UNWRITABLE, subject, Evidence(metric="m", detail="why"), Tier.HEAVY, 1.0
    )
    plan = (
        PlannedAction(ActionName.ENTER_SAFE_MODE, HELD, "n0", False, {"reason": "x"}),
        PlannedAction(ActionName.RESTORE_CHECKPOINT, HELD, None, True),
    )
    d = IncidentDecision(
        DecisionType.OPEN, sig.incident_key, sig.kind, subject, Tier.HEAVY, 1.0, sig, plan
    )
    with Session(rest.engine) as s:
        out = persist_decisions(s, decisions=[d], policy=default_policy())
        s.commit()
    [entering] = out.new_actions
    before = rest.counts()
    r = rest.release(HELD, comment="now")
    assert r.status_code == 409, r.text
    assert (
        f"incident {out.opened[0]} is putting job '{HELD}' in SAFE_MODE (action {entering}"
        in r.json()["detail"]
    )
    assert rest.counts() == before


def test_a_real_worker_clears_a_control_file_left_in_safe_mode(stack: Stack) -> None:
    run_dir = stack.run_dir(HELD)
    log = StateLog(run_dir / "state_log.jsonl")
    machine = PhaseMachine(log, run_dir=run_dir)
    # Left in SAFE_MODE by hand (no incident): the job's phase machine obeys it.
    write_control(run_dir, ControlMode.SAFE_MODE, "operator: maintenance")
    assert machine.tick() is Phase.SAFE_MODE and not machine.can_start_rollout()
    stack.start_server()
    stack.start_worker("--node", "n0", "--node", "n1", "--cluster")
    f = stack.feeder
    f.participant("n0", "trainer", 0, job=HELD, phase="SAFE_MODE")
    f.participant("n1", "rollout", 0, job=HELD, phase="SAFE_MODE")
    f.participant("n0", "trainer", 0, job=CALM, phase="TRAIN")
    f.start()
    try:

        def reported() -> bool:
            r = stack.http.get(f"/api/v1/jobs/{HELD}", headers=stack.auth(stack.viewer))
            return r.status_code == 200 and len(r.json()["participant_list"]) == 2

        stack.wait(reported, 30, "the participants' SAFE_MODE heartbeats")
        r = stack.post(f"/api/v1/jobs/{CALM}/release", json={"comment": "run"})
        assert r.status_code == 409 and "1× TRAIN" in r.json()["detail"], r.text
        r = stack.post(f"/api/v1/jobs/{HELD}/release", stack.viewer, json={"comment": "run"})
        assert r.status_code == 403, r.text
        assert read_mode(run_dir) == "safe_mode"

        r = stack.post(f"/api/v1/jobs/{HELD}/release", json={"comment": "maintenance over"})
        assert r.status_code == 202, r.text
        [incident_id] = r.json()["incidents"]
        assert sorted(a["node"] for a in r.json()["actions"]) == ["n0", "n1"]

        def closed() -> dict[str, Any] | None:
            detail = stack.get(f"/api/v1/incidents/{incident_id}", stack.viewer)
            return detail if detail["status"] == "resolved" else None

        done = stack.wait(closed, 60, "the hold incident closed by the release")
        assert (done["kind"], done["safe_mode"]) == ("safe_mode_hold", False)
        releases = [a for a in done["actions"] if a["action"] == "release_safe_mode"]
        assert len(releases) == 2 and all(a["status"] == "succeeded" for a in releases)
        assert read_mode(run_dir) == "run"
        assert machine.tick() is Phase.PREPARE and machine.can_start_rollout()

        # The job reports its new phase; a second release has nothing to clear.
        f.participant("n0", "trainer", 0, job=HELD, phase="PREPARE")
        f.participant("n1", "rollout", 0, job=HELD, phase="PREPARE")

        def left_safe_mode() -> bool:
            r = stack.http.get(f"/api/v1/jobs/{HELD}", headers=stack.auth(stack.viewer))
            return all(p["phase"] == "PREPARE" for p in r.json()["participant_list"])

        stack.wait(left_safe_mode, 30, "PREPARE heartbeats")
        r = stack.post(f"/api/v1/jobs/{HELD}/release", json={"comment": "again"})
        assert r.status_code == 409 and "2× PREPARE" in r.json()["detail"], r.text
    finally:
        log.close()
