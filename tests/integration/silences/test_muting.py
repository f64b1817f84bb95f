"""Silences, maintenance windows and inhibition through the real write path: the policy's
decisions persisted (`persist_decisions`) → the timeline (`add_event`) → alert deliveries and
action rows, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app.incidents.alert_inbox import flush_alerts
from app.incidents.held_plans import release_ended_holds
from app.incidents.persist import persist_decisions, resolve_incident
from app.models.action import RecoveryAction
from app.models.alert import AlertDelivery
from app.models.incident import Incident, IncidentEvent
from app.policy.engine import DecisionType, IncidentDecision
from app.policy.plans import ActionName, PlannedAction
from app.policy.policy_file import default_policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject, Tier
from app.silences import store
from app.silences.public import MaintenanceWindowCreate, MatcherIn, SilenceCreate

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
AT = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def open_(
    engine: Engine, kind: FaultKind, subject: Subject, now: datetime, *, act: bool = True
) -> int:
    """Persist the opening of one incident as the policy tick does; its id."""
    sig = FaultSignal(kind, subject, Evidence(metric=None, detail="seen"), Tier.MEDIUM, 0.0)
    acts = (
        (PlannedAction(ActionName.RESTART_ROLE, subject.job or "j", subject.node, False,
                       {"role": "trainer", "rank": 0}),)
        if act else ()
    )  # fmt: skip
    d = IncidentDecision(
        DecisionType.OPEN, sig.incident_key, kind, subject, Tier.MEDIUM, 0.0, sig, acts
    )
    with Session(engine) as s:
        out = persist_decisions(s, decisions=[d], policy=default_policy(), now=now)
        s.commit()
    [incident_id] = out.opened
    return incident_id


def deliveries(engine: Engine, incident_id: int) -> int:
    with Session(engine) as s:
        rows = s.exec(select(AlertDelivery).where(AlertDelivery.incident_id == incident_id))
        return len(rows.all())


def actions(engine: Engine, incident_id: int) -> int:
    with Session(engine) as s:
        rows = s.exec(select(RecoveryAction).where(RecoveryAction.incident_id == incident_id))
        return len(rows.all())


def timeline(engine: Engine, incident_id: int) -> list[tuple[str, str]]:
    with Session(engine) as s:
        rows = s.exec(
            select(IncidentEvent)
            .where(IncidentEvent.incident_id == incident_id)
            .order_by(col(IncidentEvent.id))
        ).all()
        return [(r.type, str(r.detail.get("text", ""))) for r in rows]


def silence(engine: Engine, now: datetime, *matchers: str, stops_actions: bool = False) -> int:
    ms = [MatcherIn(label=m.split("=")[0], value=m.split("=")[1]) for m in matchers]
    body = SilenceCreate(matchers=ms, duration_minutes=60, comment="riser swap",
                         stops_actions=stops_actions)  # fmt: skip
    with Session(engine) as s:
        row = store.create_silence(s, body, author="user:olga", max_hours=24, now=now)
        s.commit()
        assert row.id is not None
        return row.id


def test_a_silenced_node_gets_no_alert_an_unsilenced_one_does_and_the_silence_expires(
    engine: Engine,
) -> None:
    sid = silence(engine, AT, "node=n1")
    muted = open_(engine, FaultKind.GPU_XID, Subject(node="n1", gpu="3"), AT + timedelta(minutes=1))
    loud = open_(engine, FaultKind.GPU_XID, Subject(node="n2", gpu="3"), AT + timedelta(minutes=1))
    assert deliveries(engine, muted) == 0
    assert deliveries(engine, loud) > 0
    text = f"silenced by silence #{sid} (user:olga: riser swap)"
    assert ("silenced", text) in timeline(engine, muted)
    assert actions(engine, muted) == 1  # this silence mutes the alert only
    # An hour later the silence has ended by itself: nothing expired it.
    later = open_(engine, FaultKind.GPU_XID, Subject(node="n1", gpu="5"), AT + timedelta(hours=1))
    assert deliveries(engine, later) > 0
    assert not any(t == "silenced" for t, _ in timeline(engine, later))
    with Session(engine) as s:
        [row] = store.list_silences(s, now=AT + timedelta(hours=1))
        assert store.silence_public(row, AT + timedelta(hours=1)).state == "expired"


def test_a_silence_that_stops_actions_holds_the_plan(engine: Engine) -> None:
    sid = silence(engine, AT, "job=grpo-a", "kind=heartbeat_lost", stops_actions=True)
    subject = Subject(node="n1", job="grpo-a", role="trainer", rank=0)
    held = open_(engine, FaultKind.HEARTBEAT_LOST, subject, AT + timedelta(minutes=1))
    assert (deliveries(engine, held), actions(engine, held)) == (0, 0)
    assert [t for t, _ in timeline(engine, held)] == ["opened", "silenced", "actions_held"]
    assert timeline(engine, held)[-1][1] == (
        f"actions held: silenced by silence #{sid} (user:olga: riser swap)"
    )
    other_job = Subject(node="n1", job="grpo-b", role="trainer", rank=0)
    free = open_(engine, FaultKind.HEARTBEAT_LOST, other_job, AT + timedelta(minutes=1))
    assert actions(engine, free) == 1 and deliveries(engine, free) > 0


def test_a_node_incident_inhibits_the_alerts_of_its_gpus_and_participants(engine: Engine) -> None:
    node = open_(engine, FaultKind.NODE_SILENT, Subject(node="n1"), AT, act=False)
    gpu = open_(engine, FaultKind.GPU_XID, Subject(node="n1", gpu="2"), AT + timedelta(seconds=5))
    part = open_(
        engine, FaultKind.HEARTBEAT_LOST, Subject(node="n1", job="j", role="rollout", rank=1),
        AT + timedelta(seconds=5),
    )  # fmt: skip
    elsewhere = open_(engine, FaultKind.GPU_XID, Subject(node="n2", gpu="2"), AT)
    assert deliveries(engine, node) > 0 and deliveries(engine, elsewhere) > 0
    assert deliveries(engine, gpu) == 0 and deliveries(engine, part) == 0
    assert ("inhibited", f"inhibited by incident #{node} (node_silent on n1)") in timeline(
        engine, gpu
    )
    evidence = [text for t, text in timeline(engine, node) if t == "inhibits"]
    assert len(evidence) == 2 and f"#{gpu} (gpu_xid" in evidence[0] and f"#{part}" in evidence[1]
    # Inhibition mutes the alert, not the recovery of the process.
    assert actions(engine, part) == 1


def test_a_node_whose_gpus_failed_inhibits_the_heartbeat_lost_of_its_processes(
    engine: Engine,
) -> None:
    """Issue 21: the processes of a node whose GPUs all failed die with them; their
    heartbeat_lost is a symptom of the node_gpus_failed incident, not an alert of its own."""
    node = open_(engine, FaultKind.NODE_GPUS_FAILED, Subject(node="n1"), AT, act=False)
    part = open_(
        engine, FaultKind.HEARTBEAT_LOST, Subject(node="n1", job="j", role="trainer", rank=0),
        AT + timedelta(seconds=5),
    )  # fmt: skip
    elsewhere = open_(
        engine, FaultKind.HEARTBEAT_LOST, Subject(node="n2", job="j", role="trainer", rank=1),
        AT + timedelta(seconds=5),
    )  # fmt: skip
    assert deliveries(engine, node) > 0 and deliveries(engine, elsewhere) > 0
    assert deliveries(engine, part) == 0
    assert ("inhibited", f"inhibited by incident #{node} (node_gpus_failed on n1)") in timeline(
        engine, part
    )
    assert [t for t, _ in timeline(engine, node)].count("inhibits") == 1


def test_a_maintenance_window_mutes_silence_faults_and_holds_actions_on_its_node(
    engine: Engine,
) -> None:
    body = MaintenanceWindowCreate(node="n1", starts_at=AT, ends_at=AT + timedelta(hours=2),
                                   comment="BIOS")  # fmt: skip
    with Session(engine) as s:
        wid = store.create_window(s, body, author="user:olga", max_hours=24, now=AT).id
        s.commit()
    during = AT + timedelta(minutes=30)
    quiet = open_(engine, FaultKind.NODE_SILENT, Subject(node="n1"), during)
    assert (deliveries(engine, quiet), actions(engine, quiet)) == (0, 0)
    assert [t for t, _ in timeline(engine, quiet)] == ["opened", "maintenance", "actions_held"]
    assert (
        f"maintenance window #{wid} of node n1 (user:olga: BIOS)" in timeline(engine, quiet)[1][1]
    )
    # Not a silence fault: alerted, but nothing is restarted on the node.
    gpu = open_(engine, FaultKind.GPU_XID, Subject(node="n1", gpu="0"), during)
    assert deliveries(engine, gpu) == 0  # inhibited by the node incident, not by the window
    with Session(engine) as s:
        s.get(Incident, quiet).status = "resolved"  # type: ignore[union-attr]
        s.get(Incident, quiet).open_key = None  # type: ignore[union-attr]
        s.commit()
    gpu2 = open_(engine, FaultKind.GPU_XID, Subject(node="n1", gpu="1"), during)
    assert deliveries(engine, gpu2) > 0 and actions(engine, gpu2) == 0
    after = open_(engine, FaultKind.NODE_SILENT, Subject(node="n1"), AT + timedelta(hours=2))
    assert deliveries(engine, after) > 0 and actions(engine, after) == 1


def test_one_nodes_window_does_not_cover_a_loss_of_several_nodes(engine: Engine) -> None:
    with Session(engine) as s:
        for node in ("n1", "n2"):
            body = MaintenanceWindowCreate(node=node, starts_at=AT,
                                           ends_at=AT + timedelta(hours=1))  # fmt: skip
            store.create_window(s, body, author="user:olga", max_hours=24, now=AT)
        s.commit()

    def nodes_lost(nodes: list[str]) -> int:
        sig = FaultSignal(FaultKind.NODES_LOST, Subject(job=f"j-{len(nodes)}"),
                          Evidence(metric=None, detail="lost"), Tier.HEAVY, 0.0,
                          extra={"nodes": nodes})  # fmt: skip
        d = IncidentDecision(DecisionType.OPEN, sig.incident_key, sig.kind, sig.subject,
                             Tier.HEAVY, 0.0, sig, ())  # fmt: skip
        with Session(engine) as s:
            out = persist_decisions(s, decisions=[d], policy=default_policy(),
                                    now=AT + timedelta(minutes=5))  # fmt: skip
            s.commit()
        return out.opened[0]

    assert deliveries(engine, nodes_lost(["n1", "n2"])) == 0
    assert deliveries(engine, nodes_lost(["n1", "n2", "n3"])) > 0


def resume(engine: Engine, now: datetime) -> list[int]:
    """The scheduler's alerts job (muted alerts asked again) and its release of held plans at
    ``now``; the ids of the actions planned."""
    with Session(engine) as s:
        flush_alerts(s, now=now)
        out = release_ended_holds(s, policy=default_policy(), dry_run=False, now=now)
        s.commit()
    return out.new_actions


def test_when_the_silence_ends_the_open_incident_is_alerted_and_its_held_plan_planned(
    engine: Engine,
) -> None:
    silence(engine, AT, "node=n1", stops_actions=True)  # for an hour
    subject = Subject(node="n1", job="grpo-a", role="rollout", rank=0)
    held = open_(engine, FaultKind.HEARTBEAT_LOST, subject, AT + timedelta(minutes=1))
    assert (deliveries(engine, held), actions(engine, held)) == (0, 0)
    assert resume(engine, AT + timedelta(minutes=30)) == []  # still silenced: nothing
    assert (deliveries(engine, held), actions(engine, held)) == (0, 0)

    [action_id] = resume(engine, AT + timedelta(hours=1))
    assert deliveries(engine, held) > 0 and actions(engine, held) == 1
    types = [t for t, _ in timeline(engine, held)]
    assert types[:3] == ["opened", "silenced", "actions_held"]
    assert types[3:] == ["unmuted", "actions_released", "action_planned"]
    with Session(engine) as s:
        row = s.get(RecoveryAction, action_id)
        assert row is not None and row.action == "restart_role" and row.status == "pending"
        assert row.params == {"role": "trainer", "rank": 0}
    # Once: a later sweep finds nothing left to do.
    assert resume(engine, AT + timedelta(hours=2)) == []
    assert [t for t, _ in timeline(engine, held)][3:] == types[3:]


def test_a_gpu_incident_inhibited_by_its_node_is_alerted_once_the_node_incident_resolves(
    engine: Engine,
) -> None:
    node = open_(engine, FaultKind.NODE_SILENT, Subject(node="n1"), AT, act=False)
    gpu = open_(engine, FaultKind.GPU_XID, Subject(node="n1", gpu="2"), AT + timedelta(seconds=5))
    assert deliveries(engine, gpu) == 0
    resume(engine, AT + timedelta(seconds=10))
    assert deliveries(engine, gpu) == 0  # the node incident is still open
    with Session(engine) as s:
        inc = s.get(Incident, node)
        assert inc is not None
        resolve_incident(s, incident=inc, now=AT + timedelta(seconds=20), why="node back")
        s.commit()
    resume(engine, AT + timedelta(seconds=25))
    assert deliveries(engine, gpu) > 0
    assert [t for t, _ in timeline(engine, gpu)].count("unmuted") == 1
    # Inhibition never held its plan: nothing is planned twice.
    assert actions(engine, gpu) == 1
