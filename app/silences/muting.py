"""The mute verdicts: is this incident's alert muted, are its actions held, and by what.

Three verdicts mute an alert; the alert path asks them in its order (``app.alerts.pipeline``)
each time it flushes, so a mute that ended simply stops muting:

- inhibition: a per-GPU or per-participant incident on a node that has an open node-level
  incident (the node is lost or silent, or its GPUs failed together: its GPUs' and processes'
  faults are symptoms, and the node incident's alert already speaks for them);
- a silence whose matchers match the incident's labels and whose time range holds now;
- a maintenance window of the incident's node or job, for the heartbeat-silence kinds (a node
  being worked on stops reporting: that is the point of the window, not a fault).

Actions are held by a silence that says so (``stops_actions``) and by any open maintenance
window of the incident's node or job (nothing is restarted on a node being worked on): the
incident writer asks ``action_hold`` when it plans.

With no silence, no window and no node-level incident, every verdict is "not muted": the
behaviour of the incidents and alerts is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlmodel import Session, col, select

from app.models.incident import Incident, IncidentEventType, IncidentStatus
from app.models.silence import MaintenanceWindow, Silence
from app.policy.signals import FaultKind
from app.policy.world import SILENCE_KINDS
from app.silences.matchers import Matcher, all_match, incident_labels
from app.silences.windows import open_windows

# Incidents about a whole node: while one is open, the node's per-GPU and per-participant
# incidents are inhibited (node_gpus_failed: the processes on a node whose GPUs are gone die
# with them; their heartbeat_lost is a symptom).
NODE_KINDS = frozenset(
    {
        FaultKind.NODE_SILENT,
        FaultKind.NODES_LOST,
        FaultKind.NODE_UNAVAILABLE,
        FaultKind.NODE_GPUS_FAILED,
    }
)


@dataclass(frozen=True, slots=True)
class Mute:
    """Why an incident's alert or actions are muted, as its timeline records it."""

    type: IncidentEventType
    text: str
    detail: dict[str, Any] = field(default_factory=dict)
    inhibitor: Incident | None = None


def incident_nodes(incident: Incident) -> set[str]:
    """The nodes an incident is about: its node, or the nodes a ``nodes_lost`` names."""
    nodes = {incident.node} if incident.node else set()
    extra = (incident.evidence or {}).get("extra") or {}
    listed = extra.get("nodes") if isinstance(extra, dict) else None
    if isinstance(listed, list):
        nodes.update(str(n) for n in listed)
    return nodes


def matching_silences(session: Session, incident: Incident, now: datetime) -> list[Silence]:
    """The silences active at ``now`` whose matchers all match the incident, oldest first."""
    rows = session.exec(
        select(Silence)
        .where(Silence.starts_at <= now, Silence.ends_at > now)
        .order_by(col(Silence.id))
    ).all()
    labels = incident_labels(incident)
    return [r for r in rows if all_match([Matcher.parse(m) for m in r.matchers], labels)]


def open_window(session: Session, incident: Incident, now: datetime) -> MaintenanceWindow | None:
    """An open maintenance window covering the incident: one of its job, or windows of all
    its nodes (a ``nodes_lost`` of three nodes is not covered by one node's window: the two
    others are lost for real)."""
    rows = open_windows(session, now)
    nodes = incident_nodes(incident)
    covering: dict[str, MaintenanceWindow] = {}
    for row in rows:
        if row.job is not None and row.job != incident.job:
            continue
        if row.node is not None and row.node not in nodes:
            continue
        if row.node is None:
            return row  # the job's window covers every node of the job
        covering.setdefault(row.node, row)
    if nodes and nodes <= covering.keys():
        return covering[min(nodes)]
    return None


def _silence_text(row: Silence) -> str:
    return f"silenced by silence #{row.id} ({row.author}: {row.comment})"


def _window_text(row: MaintenanceWindow) -> str:
    what = f"node {row.node}" if row.node else f"job {row.job}"
    return f"maintenance window #{row.id} of {what} ({row.author}: {row.comment})"


def node_incident_for(session: Session, incident: Incident) -> Incident | None:
    """The open node-level incident that inhibits ``incident``, if any."""
    subject = incident.subject or {}
    per_part = subject.get("gpu") is not None or subject.get("role") is not None
    if not per_part or not incident.node or incident.kind in NODE_KINDS:
        return None
    candidates = session.exec(
        select(Incident)
        .where(
            Incident.status == IncidentStatus.open.value,
            col(Incident.kind).in_([k.value for k in NODE_KINDS]),
            Incident.id != incident.id,
        )
        .order_by(col(Incident.id))
    ).all()
    return next((c for c in candidates if incident.node in incident_nodes(c)), None)


def inhibition(session: Session, incident: Incident, now: datetime) -> Mute | None:
    """Muted while an open node-level incident of its node speaks for it."""
    node_incident = node_incident_for(session, incident)
    if node_incident is None:
        return None
    return Mute(
        IncidentEventType.INHIBITED,
        f"inhibited by incident #{node_incident.id} ({node_incident.kind} on {incident.node})",
        {"incident_id": node_incident.id, "kind": node_incident.kind},
        inhibitor=node_incident,
    )


def silencing(session: Session, incident: Incident, now: datetime) -> Mute | None:
    """Muted by the oldest active silence whose matchers all match."""
    silence = next(iter(matching_silences(session, incident, now)), None)
    if silence is None:
        return None
    return Mute(
        IncidentEventType.SILENCED,
        _silence_text(silence),
        {"silence_id": silence.id, "author": silence.author, "comment": silence.comment},
    )


def maintenance(session: Session, incident: Incident, now: datetime) -> Mute | None:
    """Muted by an open maintenance window, for the heartbeat-silence kinds only."""
    if incident.kind not in SILENCE_KINDS:
        return None
    window = open_window(session, incident, now)
    if window is None:
        return None
    return Mute(
        IncidentEventType.MAINTENANCE,
        f"alert muted: {_window_text(window)}",
        {"window_id": window.id},
    )


def action_hold(session: Session, incident: Incident, now: datetime) -> Mute | None:
    silences = matching_silences(session, incident, now)
    silence = next((s for s in silences if s.stops_actions), None)
    if silence is not None:
        return Mute(
            IncidentEventType.ACTIONS_HELD,
            f"actions held: {_silence_text(silence)}",
            {"silence_id": silence.id, "author": silence.author, "comment": silence.comment},
        )
    window = open_window(session, incident, now)
    if window is not None:
        return Mute(
            IncidentEventType.ACTIONS_HELD,
            f"actions held: {_window_text(window)}",
            {"window_id": window.id},
        )
    return None
