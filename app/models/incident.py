"""Incidents: grouped fault signals with their timeline and evidence."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from app.models._types import UTCDateTime, utcnow


class IncidentStatus(enum.StrEnum):
    open = "open"
    resolved = "resolved"


class IncidentEventType(enum.StrEnum):
    """What one timeline entry (``IncidentEvent.type``) records.

    One vocabulary for the writers (incidents, approvals, actions, the SAFE_MODE release) and
    the readers (alerts, the dashboard, goodput): a misspelt type fails where it is written
    instead of being stored and silently matching nothing (no alert, no label).
    """

    OPENED = "opened"
    UPDATED = "updated"
    ESCALATED = "escalated"
    RECOVERY_RETRY = "recovery_retry"
    RECOVERY_DID_NOT_HOLD = "recovery_did_not_hold"
    ACTION_PLANNED = "action_planned"
    ACTION_STARTED = "action_started"
    ACTION_SUCCEEDED = "action_succeeded"
    ACTION_FAILED = "action_failed"
    APPROVAL_REQUESTED = "approval_requested"
    APPROVAL_GRANTED = "approval_granted"
    APPROVAL_REJECTED = "approval_rejected"
    APPROVAL_EXPIRED = "approval_expired"
    SAFE_MODE = "safe_mode"
    RELEASE_REQUESTED = "release_requested"
    SAFE_MODE_RELEASED = "safe_mode_released"
    RESOLVED = "resolved"
    # Guard-rails (app/guardrails/gate.py): what became of a planned action that did not simply run.
    ACTION_DRY_RUN = "action_dry_run"  # written as dry_run: shown, never sent
    ACTION_DEFERRED = "action_deferred"  # waits for the backoff on its participant
    ACTION_NOT_RUN = "action_not_run"  # not written: hands off, or the scope's breaker is open
    GUARDRAIL_ESCALATED = "guardrail_escalated"  # a budget spent: waits for an approver
    BREAKER_TRIPPED = "breaker_tripped"  # this plan tripped a breaker: waits for an approver
    BREAKER_RESET = "breaker_reset"  # on the incident that tripped it: an approver closed it
    # Silences, maintenance windows, inhibition (app/silences/): why an alert was not sent or an action not planned.
    SILENCED = "silenced"  # a silence matched: no alert
    MAINTENANCE = "maintenance"  # a maintenance window of its node or job: no alert
    INHIBITED = "inhibited"  # a node-level incident on its node speaks for it: no alert
    INHIBITS = "inhibits"  # on the node-level incident: names the incident it took over
    ACTIONS_HELD = "actions_held"  # a silence or maintenance window holds its recovery plan
    # When what muted it ends, the incident still open (app/incidents/alert_inbox.py and
    # held_plans.py):
    UNMUTED = "unmuted"  # its alert goes out now (alerted like an opening)
    ACTIONS_RELEASED = "actions_released"  # its held plan is planned now
    # A whole-job action of this plan that another open incident of the job already has in
    # flight (app/incidents/whole_job.py): not written a second time.
    ACTION_COVERED = "action_covered"
    # An action of a plan claimed after the plan's approved action had started: not run, since
    # it would undo what that one did (app/actions/plan_order.py).
    ACTION_SUPERSEDED = "action_superseded"
    # Hang forensics (app/incidents/stacks.py): a process's Python stacks, or why there are none.
    STACKS_CAPTURED = "stacks_captured"
    # rlguard drill (app/drills): the fault was injected on purpose; not a fault in the ETTR.
    DRILL = "drill"


class Incident(SQLModel, table=True):
    """One fault (kind + subject) from its first signal until it is resolved.

    ``open_key`` equals ``key`` while the incident is open and is NULL once resolved; its unique
    constraint is what makes "one open incident per kind and subject" hold even with two
    writers racing (NULLs never collide, on SQLite and PostgreSQL alike).
    """

    __tablename__ = "incident"

    id: int | None = Field(default=None, primary_key=True)
    key: str = Field(max_length=300, index=True)
    open_key: str | None = Field(default=None, max_length=300, unique=True)
    kind: str = Field(max_length=64, index=True)
    tier: str = Field(max_length=16)
    status: str = Field(default=IncidentStatus.open.value, max_length=16, index=True)
    subject: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)
    job: str | None = Field(default=None, max_length=128, index=True)
    node: str | None = Field(default=None, max_length=128)
    summary: str = Field(default="", max_length=500)
    evidence: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)
    reasons: list[str] = Field(default_factory=list, sa_type=sa.JSON)
    escalated: bool = False
    safe_mode: bool = False
    recovery_failures: int = 0
    opened_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    resolved_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    detection_delay_seconds: float | None = None


class AlertState(enum.StrEnum):
    """Where a timeline entry worth a message is on the alert path (app/incidents/alert_inbox.py);
    entries not worth one have none."""

    PENDING = "pending"  # appended; the alert path has not asked its stages yet
    MUTED = "muted"  # a stage muted it; asked again at every flush while the incident is open
    DONE = "done"  # its deliveries were queued, or it was dropped or alerted by an `unmuted`


class IncidentEvent(SQLModel, table=True):
    """One line of an incident's timeline: what happened, who did it, when."""

    __tablename__ = "incident_event"

    id: int | None = Field(default=None, primary_key=True)
    incident_id: int = Field(foreign_key="incident.id", index=True, ondelete="CASCADE")
    at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    type: str = Field(max_length=32)  # an IncidentEventType
    actor: str = Field(default="system", max_length=160)  # system, user:<name>, worker:<host>
    detail: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)
    alert_state: str | None = Field(default=None, max_length=8, index=True)  # an AlertState


class FaultSignalRecord(SQLModel, table=True):
    """A fault signal as the engine saw it when it opened, updated or escalated an incident."""

    __tablename__ = "fault_signal"

    id: int | None = Field(default=None, primary_key=True)
    incident_id: int = Field(foreign_key="incident.id", index=True, ondelete="CASCADE")
    at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    kind: str = Field(max_length=64)
    tier: str = Field(max_length=16)
    subject: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)
    evidence: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)
    since: float | None = None
