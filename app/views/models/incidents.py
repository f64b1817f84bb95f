"""Incidents and approvals as the dashboard shows them.

Lists and details come from ``app.incidents.queries`` (what the REST API serves); this module adds
what only the pages need: counts for the overview tiles, the evidence of a fault signal as a chart
that shows the window the detector looked at and the threshold that fired, and the timeline in
words and colours.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlmodel import Session, col, func, select

from app.core.errors import NotFound
from app.incidents import queries as incident_queries
from app.incidents.public import IncidentDetail
from app.models.approval import Approval, ApprovalStatus
from app.models.incident import Incident, IncidentEventType, IncidentStatus
from app.policy.policy_file import Policy, default_policy
from app.policy.signals import Tier
from app.series.store import SeriesStore
from app.views.models.charts import ChartSpec, Threshold, aligned_chart, golden_bands
from app.views.models.evidence import STUCK_KINDS, EvidencePanel, evidence_panel
from app.views.models.health import TIER_LEVEL
from app.views.models.phases import phase_timeline

TIERS = tuple(Tier)

# Timeline event types → colour and words for people.
EVENT_LABELS: dict[str, tuple[str, str]] = {
    IncidentEventType.OPENED: ("bad", "Incident opened"),
    IncidentEventType.UPDATED: ("idle", "New evidence"),
    IncidentEventType.ESCALATED: ("bad", "Escalated"),
    IncidentEventType.ACTION_PLANNED: ("idle", "Action planned"),
    IncidentEventType.ACTION_STARTED: ("warn", "Action started"),
    IncidentEventType.ACTION_SUCCEEDED: ("ok", "Action succeeded"),
    IncidentEventType.ACTION_FAILED: ("bad", "Action failed"),
    IncidentEventType.RECOVERY_DID_NOT_HOLD: ("bad", "Fault back after its recovery succeeded"),
    IncidentEventType.APPROVAL_REQUESTED: ("warn", "Approval requested"),
    IncidentEventType.APPROVAL_GRANTED: ("ok", "Approved"),
    IncidentEventType.APPROVAL_REJECTED: ("bad", "Rejected"),
    IncidentEventType.APPROVAL_EXPIRED: ("bad", "Approval expired"),
    IncidentEventType.SAFE_MODE: ("warn", "Job put in SAFE_MODE"),
    IncidentEventType.RESOLVED: ("ok", "Resolved"),
    IncidentEventType.ACTION_DRY_RUN: ("idle", "Dry run: not run"),
    IncidentEventType.ACTION_DEFERRED: ("warn", "Action deferred (backoff)"),
    IncidentEventType.ACTION_NOT_RUN: ("warn", "Action not run (guard-rail)"),
    IncidentEventType.GUARDRAIL_ESCALATED: ("bad", "Budget spent: needs approval"),
    IncidentEventType.BREAKER_TRIPPED: ("bad", "Circuit breaker tripped"),
    IncidentEventType.BREAKER_RESET: ("ok", "Circuit breaker reset"),
    IncidentEventType.SILENCED: ("idle", "Alert silenced"),
    IncidentEventType.MAINTENANCE: ("idle", "Alert muted by a maintenance window"),
    IncidentEventType.INHIBITED: ("idle", "Alert inhibited by a node incident"),
    IncidentEventType.INHIBITS: ("idle", "Took over an incident on this node"),
    IncidentEventType.ACTIONS_HELD: ("warn", "Actions held"),
    IncidentEventType.UNMUTED: ("bad", "No longer muted: alerted"),
    IncidentEventType.ACTIONS_RELEASED: ("warn", "Hold ended: plan released"),
    IncidentEventType.ACTION_COVERED: ("idle", "Action already in flight for the job"),
    IncidentEventType.ACTION_SUPERSEDED: ("idle", "Not run: the approved action ran first"),
    IncidentEventType.STACKS_CAPTURED: ("idle", "Python stacks captured"),
    IncidentEventType.DRILL: ("warn", "Drill: fault injected on purpose (not counted in ETTR)"),
}

# A stacks block longer than this many lines starts collapsed (the timeline stays readable).
STACKS_OPEN_MAX_LINES = 40

ACTION_LEVELS = {
    "pending_approval": "warn",
    "pending": "idle",
    "dispatched": "idle",
    "running": "warn",
    "succeeded": "ok",
    "failed": "bad",
    "cancelled": "idle",
    "dry_run": "idle",
}


@dataclass(slots=True)
class IncidentCounts:
    light: int = 0
    medium: int = 0
    heavy: int = 0

    @property
    def total(self) -> int:
        return self.light + self.medium + self.heavy


def open_incident_counts(session: Session) -> IncidentCounts:
    counts = IncidentCounts()
    rows = session.exec(
        select(Incident.tier, func.count())
        .where(Incident.status == IncidentStatus.open.value)
        .group_by(Incident.tier)
    ).all()
    for tier, n in rows:
        if tier in TIERS:
            setattr(counts, tier, int(n))
    return counts


def open_tiers_by_node(session: Session) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for node, tier in session.exec(
        select(Incident.node, Incident.tier).where(Incident.status == IncidentStatus.open.value)
    ).all():
        if node:
            out.setdefault(node, []).append(tier)
    return out


def safe_mode_jobs(session: Session) -> set[str]:
    rows = session.exec(
        select(Incident.job).where(
            Incident.status == IncidentStatus.open.value, col(Incident.safe_mode).is_(True)
        )
    ).all()
    return {job for job in rows if job}


def pending_approvals_count(session: Session) -> int:
    return int(
        session.exec(
            select(func.count())
            .select_from(Approval)
            .where(Approval.status == ApprovalStatus.pending.value)
        ).one()
    )


def evidence_of(stored: dict[str, Any]) -> dict[str, Any]:
    """The evidence part of what the incident service stored: a whole signal (kind, subject,
    evidence, since) for incidents, the evidence itself for older rows and tests."""
    inner = stored.get("evidence")
    return inner if isinstance(inner, dict) else stored


def evidence_chart(evidence: dict[str, Any], *, title: str = "Evidence") -> ChartSpec | None:
    """The series window a detector looked at, the threshold it compared with, the window shaded."""
    values = evidence.get("values") or []
    points: list[tuple[float, float]] = []
    for item in values:
        if isinstance(item, list | tuple) and len(item) == 2:
            try:
                points.append((float(item[0]), float(item[1])))
            except (TypeError, ValueError):
                continue
    if not points:
        return None
    metric = str(evidence.get("metric") or "value")
    step = max(1.0, (points[-1][0] - points[0][0]) / 300) if len(points) > 1 else 1.0
    spec = aligned_chart(title, {metric: points}, step_seconds=step)
    threshold = evidence.get("threshold")
    window = evidence.get("window_seconds")
    if isinstance(threshold, int | float):
        spec.thresholds = [Threshold(float(threshold), f"threshold {threshold:g}", "bad")]
    if isinstance(window, int | float) and window > 0:
        end = points[-1][0]
        spec.window = (end - float(window), end)
    healthy = evidence.get("healthy")
    if (
        isinstance(healthy, int | float)
        and isinstance(threshold, int | float)
        and healthy < threshold
    ):
        spec.bands = golden_bands(float(healthy), float(threshold))
    return spec


@dataclass(slots=True)
class TimelineEntry:
    at: Any
    level: str
    title: str
    actor: str
    detail: dict[str, Any] = field(default_factory=dict)
    # Hang forensics: a process's py-spy dump, shown in a <pre> (escaped by the template).
    stacks: str | None = None
    # Names the dump's element for the page's polls, which keep one the reader opened open.
    stacks_id: str | None = None

    @property
    def stacks_collapsed(self) -> bool:
        return self.stacks is not None and self.stacks.count("\n") > STACKS_OPEN_MAX_LINES


def _detail_text(value: Any) -> str:
    """A timeline detail value as a person reads it: short numbers, UTC times without micros."""
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    if isinstance(value, str) and len(value) >= 19 and value[4] == "-" and value[10] == "T":
        try:
            return datetime.fromisoformat(value).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        except ValueError:
            return value
    if isinstance(value, list | tuple):
        return ", ".join(_detail_text(v) for v in value)
    return str(value)


def timeline_entries(events: list[Any]) -> list[TimelineEntry]:
    out = []
    for e in events:
        level, title = EVENT_LABELS.get(e.type, ("idle", e.type.replace("_", " ").capitalize()))
        raw = dict(e.detail or {})
        stacks = None
        if e.type == IncidentEventType.STACKS_CAPTURED:
            stacks = str(raw.pop("text", "") or "") or None
            if not raw.get("ok"):
                level, title = "warn", "No Python stacks"
        detail = {
            k.replace("_", " "): _detail_text(v)
            for k, v in raw.items()
            if v not in (None, "", [], {})
        }
        out.append(
            TimelineEntry(
                at=e.at,
                level=level,
                title=title,
                actor=e.actor,
                detail=detail,
                stacks=stacks,
                # A row's time and process never change: the same id on every poll (one
                # capture of several ranks writes its rows at one time, each of its own pid).
                stacks_id=(
                    f"stacks-{e.at:%Y%m%d%H%M%S%f}-{raw.get('pid', '')}"
                    if stacks is not None
                    else None
                ),
            )
        )
    return out


def tier_level(tier: str) -> str:
    return TIER_LEVEL.get(tier, "idle")


@dataclass(slots=True)
class IncidentPage:
    incident: IncidentDetail
    level: str
    evidence: ChartSpec | None
    evidence_data: dict[str, Any]
    timeline: list[TimelineEntry]
    panel: EvidencePanel

    @property
    def final(self) -> bool:
        """Nothing on the page can change any more: it stops polling."""
        inc = self.incident
        busy = {"pending_approval", "pending", "dispatched", "running"}
        return inc.status == "resolved" and not any(a.status in busy for a in inc.actions)


EVIDENCE_LOOKBACK_SECONDS = 300.0
MIN_EVIDENCE_POINTS = 3


def evidence_from_store(
    store: SeriesStore,
    evidence: dict[str, Any],
    subject: dict[str, Any],
    *,
    opened_at: float,
    end: float,
) -> ChartSpec | None:
    """The subject's series around the moment the incident opened, from the live window.

    Event-like signals (a counter that rose, a flag) carry one point of evidence; the series
    itself shows the step that fired. Only what is still in the live window can be drawn.
    """
    metric, node = evidence.get("metric"), subject.get("node")
    if not metric or not node:
        return None
    wanted = {
        k: str(subject[k]) for k in ("job", "role", "rank", "gpu") if subject.get(k) is not None
    }
    series: dict[str, list[tuple[float, float]]] = {}
    for key in store.keys(node=str(node), name=str(metric)):
        if all(key.label(k) == v for k, v in wanted.items()):
            since = opened_at - EVIDENCE_LOOKBACK_SECONDS
            points = [(p.ts, p.value) for p in store.since(key, since) if p.ts <= end]
            if points:
                role, rank, gpu = key.label("role"), key.label("rank"), key.label("gpu")
                label = f"{role}/{rank}" if role else (f"GPU {gpu}" if gpu else str(metric))
                series[label] = points
    if not series:
        return None
    span = max(p[-1][0] for p in series.values()) - min(p[0][0] for p in series.values())
    spec = aligned_chart(f"Evidence: {metric}", series, step_seconds=max(1.0, span / 300))
    window = evidence.get("window_seconds")
    values = evidence.get("values") or []
    start = float(values[0][0]) if values and isinstance(values[0], list | tuple) else opened_at
    counter = str(metric).endswith("_total")
    if isinstance(window, int | float) and window > 0:
        # A counter's window starts at its first increase; a level's window ends at the breach.
        spec.window = (start, start + window) if counter else (start - window, start)
    threshold = evidence.get("threshold")
    if isinstance(threshold, int | float) and not counter:
        spec.thresholds = [Threshold(float(threshold), f"threshold {threshold:g}", "bad")]
    return spec


def participant_phases(
    session: Session, subject: dict[str, Any], *, now: float, limit: int = 8
) -> list[tuple[str, str]]:
    """The subject's last phase changes (newest last) as (when, what), for a stuck process."""
    job, role, rank = subject.get("job"), subject.get("role"), subject.get("rank")
    if not job or role is None:
        return []
    try:
        timeline = phase_timeline(session, job=str(job), now=now, minutes=30)
    except NotFound:
        return []
    who = f"{role}/{rank}" if rank is not None else None
    lanes = [lane for lane in timeline.lanes if who is None or lane.who == who]
    bands = sorted((b for lane in lanes for b in lane.bands), key=lambda b: b.start)[-limit:]
    return [
        (
            datetime.fromtimestamp(b.start, UTC).strftime("%H:%M:%S UTC"),
            f"{b.phase} at step {b.step} for {b.seconds:.0f} s",
        )
        for b in bands
    ]


def incident_page(
    session: Session,
    *,
    incident_id: int,
    store: SeriesStore | None = None,
    policy: Policy | None = None,
) -> IncidentPage:
    """Raises ``NotFound`` (from the incidents service) for an unknown id."""
    detail = incident_queries.incident_detail(session, incident_id=incident_id)
    data = evidence_of(detail.evidence)
    metric = data.get("metric") or detail.kind
    evidence = evidence_chart(data, title=f"Evidence: {metric}")
    if store is not None and (evidence is None or len(evidence.x) < MIN_EVIDENCE_POINTS):
        end = detail.resolved_at.timestamp() if detail.resolved_at else time.time()
        opened = detail.opened_at.timestamp()
        from_store = evidence_from_store(store, data, detail.subject, opened_at=opened, end=end)
        evidence = from_store or evidence
    now = time.time()
    phases = (
        participant_phases(session, detail.subject, now=now)
        if detail.kind in {k.value for k in STUCK_KINDS}
        else []
    )
    panel = evidence_panel(
        detail.evidence,
        kind=detail.kind,
        policy=policy or default_policy(),
        now=now,
        chart=evidence,
        phases=phases,
    )
    return IncidentPage(
        incident=detail,
        level=tier_level(detail.tier),
        evidence=panel.chart,
        evidence_data=data,
        timeline=timeline_entries(detail.timeline),
        panel=panel,
    )
