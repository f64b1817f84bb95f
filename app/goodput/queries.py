"""Reading a job's ledger inputs from the database (incidents, actions, approvals, timelines,
step progress, checkpoint rollups, nodes' GPUs) and building its ledger.

Every read is bounded by the window (plus ``LOOKBACK`` before it, so the incident or step that
a window opens in the middle of is known) and by indexed columns.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, func, select

from app.core.config import Settings
from app.core.errors import InvalidInput, NotFound
from app.goodput.breakdown import IncidentFacts
from app.goodput.counterfactual import ClassCost, class_costs
from app.goodput.intervals import Interval
from app.goodput.ledger import LedgerInput, build_ledger
from app.goodput.public import JobGoodput
from app.goodput.steps import StepPoint
from app.ingest.step_progress import RECORDED_RANK
from app.models import Job, MetricRollup, Participant, utcnow
from app.models.action import ActionStatus, RecoveryAction
from app.models.approval import Approval, ApprovalStatus
from app.models.drill import Drill
from app.models.incident import Incident, IncidentEvent, IncidentEventType
from app.models.progress import StepProgress
from app.policy.plans import ActionName
from app.policy.policy_file import load_policy

LOOKBACK = timedelta(days=1)
CHECKPOINT_STEP = "checkpoint_committed_step"
GPU_METRIC = "gpu_utilization_ratio"
#: Actions that are not the recovery itself: they stop the job or only record a decision.
NOT_RECOVERY = frozenset({ActionName.ENTER_SAFE_MODE.value})
MAX_WINDOW = timedelta(days=90)


def check_window(since: datetime, until: datetime, *, now: datetime) -> None:
    """Raises InvalidInput naming the bad bound (naive, reversed, future, too long)."""
    for name, value in (("since", since), ("until", until)):
        if value.tzinfo is None:
            raise InvalidInput(
                f"{name} must carry a time zone (e.g. ...Z), got {value.isoformat()!r}"
            )
    if since >= until:
        raise InvalidInput(
            f"since ({since.isoformat()}) must be before until ({until.isoformat()})"
        )
    if since > now:
        raise InvalidInput(f"since {since.isoformat()!r} is in the future")
    if until - since > MAX_WINDOW:
        raise InvalidInput(
            f"the window {since.isoformat()} .. {until.isoformat()} is longer than "
            f"{MAX_WINDOW.days} days"
        )


def job_goodput(
    session: Session,
    *,
    job: str,
    since: datetime,
    until: datetime,
    now: datetime,
    settings: Settings,
) -> JobGoodput:
    """The ledger of ``job`` over ``[since, until)`` (``until`` is capped at ``now``).

    Raises NotFound for an unknown job and InvalidInput for a bad window.
    """
    check_window(since, until, now=now)
    row = session.exec(select(Job).where(Job.name == job)).first()
    if row is None:
        raise NotFound(f"no job named {job!r}")
    until = min(until, now)
    return build_ledger(_ledger_input(session, row, since=since, until=until, settings=settings))


def jobs_seen(session: Session, *, since: datetime) -> list[str]:
    """Jobs that reported at or after ``since``."""
    return list(
        session.exec(
            select(Job.name).where(col(Job.last_seen_at) >= since).order_by(col(Job.name))
        ).all()
    )


def _ledger_input(
    session: Session, job: Job, *, since: datetime, until: datetime, settings: Settings
) -> LedgerInput:
    g = settings.goodput
    steps, started = _steps(session, job.name, roles=g.trainer_roles, since=since, until=until)
    first_seen = min(
        started if started is not None else job.created_at.timestamp(), job.created_at.timestamp()
    )
    last_seen = max(
        (job.last_seen_at or job.created_at).timestamp(),
        steps[-1].at if steps else first_seen,
    )
    gpus, source = _gpu_count(session, job.name, until=until, default_per_node=g.gpus_per_node)
    return LedgerInput(
        job=job.name,
        since=since.timestamp(),
        until=until.timestamp(),
        first_seen=first_seen,
        last_seen=last_seen,
        steps=steps,
        incidents=_incidents(session, job.name, since=since, until=until),
        checkpoints=_checkpoints(session, job.name, since=since, until=until),
        gpu_count=gpus,
        gpu_count_source=source,
        price_per_gpu_hour=g.price_per_gpu_hour,
        human_detection_seconds=g.human_detection_delay_seconds,
        checkpoint_every_steps=settings.policy.checkpoint_interval_steps,
        class_costs=_class_costs(settings.recovery.policy_file),
    )


@functools.lru_cache(maxsize=4)
def _class_costs(policy_file: Any) -> dict[str, ClassCost]:
    """The policy file's counterfactual classes (read once per file: it does not change while
    the server runs)."""
    return class_costs(load_policy(policy_file).counterfactual.classes)


def _steps(
    session: Session, job: str, *, roles: list[str], since: datetime, until: datetime
) -> tuple[list[StepPoint], float | None]:
    """The trainer's step points from ``since - LOOKBACK`` and the job's first report."""
    s = StepProgress
    base = select(s).where(
        s.job_name == job, col(s.role).in_(roles), s.rank == RECORDED_RANK, s.at < until
    )
    rows = session.exec(base.where(s.at >= since - LOOKBACK).order_by(col(s.at))).all()
    first = session.exec(base.order_by(col(s.at)).limit(1)).first()
    return [StepPoint(r.at.timestamp(), r.step) for r in rows], (
        first.at.timestamp() if first is not None else None
    )


def _incidents(
    session: Session, job: str, *, since: datetime, until: datetime
) -> list[IncidentFacts]:
    incs = session.exec(
        select(Incident)
        .where(
            Incident.job == job,
            col(Incident.opened_at) < until,
            (col(Incident.resolved_at).is_(None)) | (col(Incident.resolved_at) >= since - LOOKBACK),
        )
        .order_by(col(Incident.id))
    ).all()
    if not incs:
        return []
    ids = [i.id for i in incs]
    drilled = _drill_incidents(session, job)
    actions: dict[int, list[RecoveryAction]] = defaultdict(list)
    for a in session.exec(select(RecoveryAction).where(col(RecoveryAction.incident_id).in_(ids))):
        actions[a.incident_id].append(a)
    approvals: dict[int, list[Approval]] = defaultdict(list)
    for ap in session.exec(select(Approval).where(col(Approval.incident_id).in_(ids))):
        approvals[ap.incident_id].append(ap)
    releases: dict[int, list[float]] = defaultdict(list)
    for ev in session.exec(
        select(IncidentEvent).where(
            col(IncidentEvent.incident_id).in_(ids),
            IncidentEvent.type == IncidentEventType.RELEASE_REQUESTED.value,
        )
    ):
        releases[ev.incident_id].append(ev.at.timestamp())
    out = []
    for inc in incs:
        assert inc.id is not None
        detected = inc.opened_at.timestamp()
        done = [
            a.finished_at.timestamp()
            for a in actions[inc.id]
            if a.status == ActionStatus.succeeded.value
            and a.action not in NOT_RECOVERY
            and a.finished_at is not None
        ]
        held = inc.safe_mode or any(
            a.action == ActionName.ENTER_SAFE_MODE.value
            and a.status == ActionStatus.succeeded.value
            for a in actions[inc.id]
        )
        out.append(
            IncidentFacts(
                id=inc.id,
                kind=inc.kind,
                tier=inc.tier,
                fault_at=detected - (inc.detection_delay_seconds or 0.0),
                detected_at=detected,
                recovered_at=max(done) if done else None,
                resolved_at=inc.resolved_at.timestamp() if inc.resolved_at else None,
                approval_waits=tuple(
                    _approval_wait(ap, held=held, releases=releases[inc.id], until=until)
                    for ap in approvals[inc.id]
                ),
                drill=inc.id in drilled,
            )
        )
    return out


def _drill_incidents(session: Session, job: str) -> set[int]:
    """Incidents of ``job`` that a drill's fault opened (app/drills links them)."""
    out: set[int] = set()
    for linked in session.exec(select(Drill.incident_ids).where(Drill.job == job)):
        out.update(i for i in linked or [] if isinstance(i, int))
    return out


def _approval_wait(ap: Approval, *, held: bool, releases: list[float], until: datetime) -> Interval:
    """From the request until an approver let the job go on.

    Approved: the decision. Rejected or expired while the job is held in SAFE_MODE: the job
    still waits for an approver, until one asks for its release (or the window's end).
    """
    start = ap.requested_at.timestamp()
    end = until.timestamp()
    if ap.status == ApprovalStatus.approved.value and ap.decided_at is not None:
        end = ap.decided_at.timestamp()
    elif ap.status != ApprovalStatus.pending.value and ap.decided_at is not None:
        decided = ap.decided_at.timestamp()
        later = [t for t in releases if t >= decided]
        end = min(later) if later else (end if held else decided)
    return Interval(start, max(start, end))


def _checkpoints(
    session: Session, job: str, *, since: datetime, until: datetime
) -> list[tuple[float, int]]:
    """(when, step) of the job's committed checkpoints, from the per-minute rollups."""
    r = MetricRollup
    rows = session.exec(
        select(r.labels, r.last, r.last_ts).where(
            r.name == CHECKPOINT_STEP, r.minute >= since - LOOKBACK, r.minute < until
        )
    ).all()
    # Few rows (reporters x minutes); the label filter runs here, as the Job page's does.
    return sorted(
        (float(ts), int(last)) for labels, last, ts in rows if (labels or {}).get("job") == job
    )


def _gpu_count(
    session: Session, job: str, *, until: datetime, default_per_node: int
) -> tuple[int, str]:
    """GPUs on the job's participants' nodes: as reported in the last hour, else the default."""
    nodes = set(
        n
        for n in session.exec(
            select(Participant.node_name).where(Participant.job_name == job)
        ).all()
        if n
    )
    if not nodes:
        return default_per_node, "default"
    r = MetricRollup
    # One row per GPU series (its newest minute), not one per series and minute: a GPU's labels
    # are the same every minute, and decoding 60 JSON label sets per GPU and job made this the
    # Overview's slowest query at 1,000 nodes (benchmarks/dashboard.py). Grouped by series_id,
    # not by labels: PostgreSQL's json type has no equality.
    newest = (
        select(func.max(r.id))
        .where(
            r.name == GPU_METRIC,
            col(r.node).in_(sorted(nodes)),
            r.minute >= until - timedelta(hours=1),
            r.minute < until,
        )
        .group_by(r.series_id)
    )
    seen: dict[str, set[Any]] = defaultdict(set)
    for node, labels in session.exec(select(r.node, r.labels).where(col(r.id).in_(newest))).all():
        seen[node].add((labels or {}).get("gpu"))
    reported = sum(len(seen[n]) for n in nodes if seen.get(n))
    missing = [n for n in nodes if not seen.get(n)]
    source = (
        "reported"
        if not missing
        else ("default" if len(missing) == len(nodes) else "partly default")
    )
    return reported + default_per_node * len(missing), source


#: Window of the exported ETTR gauge; the GPU-hours counter covers the job's life (≤ MAX_WINDOW).
METRICS_ETTR_WINDOW = timedelta(hours=24)


def metrics_snapshot(
    session: Session, *, now: datetime, settings: Settings
) -> list[tuple[str, float, float]]:
    """``(job, ETTR over the last 24 h, GPU-hours lost over its life)`` of every job that
    reported in the last 24 h, for ``/metrics``."""
    out = []
    for name in jobs_seen(session, since=now - METRICS_ETTR_WINDOW):
        job = session.exec(select(Job).where(Job.name == name)).one()
        day = build_ledger(
            _ledger_input(
                session, job, since=now - METRICS_ETTR_WINDOW, until=now, settings=settings
            )
        )
        # Its life: the wall time is clipped to its first report anyway.
        life = build_ledger(
            _ledger_input(session, job, since=now - MAX_WINDOW, until=now, settings=settings)
        )
        out.append((name, day.ettr, life.gpu_hours_lost))
    return out


def metrics_source(
    engine: Engine, settings: Settings
) -> Callable[[], list[tuple[str, float, float]]]:
    """What ``app.metrics.GoodputCollector`` calls (in the scrape's thread)."""

    def compute() -> list[tuple[str, float, float]]:
        with Session(engine) as session:
            return metrics_snapshot(session, now=utcnow(), settings=settings)

    return compute


def cluster_ettr(
    session: Session, *, since: datetime, until: datetime, now: datetime, settings: Settings
) -> tuple[float, int, float]:
    """``(ETTR, jobs, GPU-hours lost)`` of every job that reported in the window, each job
    weighted by its GPUs (a 1,000-GPU job's hour counts more than an 8-GPU job's)."""
    check_window(since, until, now=now)
    until = min(until, now)
    wall = productive = lost = 0.0
    names = jobs_seen(session, since=since)
    for name in names:
        job = session.exec(select(Job).where(Job.name == name)).one()
        g = build_ledger(_ledger_input(session, job, since=since, until=until, settings=settings))
        wall += g.wall_seconds * g.gpu_count
        productive += g.productive_seconds * g.gpu_count
        lost += g.gpu_hours_lost
    return (1.0 if wall <= 0 else productive / wall), len(names), lost
