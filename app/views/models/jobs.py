"""The Job page: participants with heartbeat age and liveness marks, golden metrics with bands."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta

from sqlmodel import Session, select

from app.cluster import queries as cluster
from app.models import Job, MetricRollup, from_epoch
from app.policy.policy_file import Policy
from app.series.store import SeriesStore
from app.views.models.charts import Band, ChartSpec, Threshold, aligned_chart, golden_bands
from app.views.models.health import liveness_level, liveness_mark
from app.views.models.phases import PhaseTimeline, phase_timeline

HISTORY_MINUTES = 60
STEP_SECONDS = 10.0
ROLLOUT_PENDING_RATIO = "rollout_pending_ratio"
SHARD_REBUILDS_5M = "actor_shard_rebuild_count_5m"
STATE_LOG_LATENCY_MS = "state_log_write_latency_ms"
# The golden metrics' charts, in page order: title and unit.
GOLDEN_CHART_METRICS = {
    ROLLOUT_PENDING_RATIO: ("Rollout pending ratio", ""),
    SHARD_REBUILDS_5M: ("Actor shard rebuilds (5 min)", ""),
    STATE_LOG_LATENCY_MS: ("State-log write latency", "ms"),
}
TRAIN_STEP = "train_step"
TOKENS_PER_SECOND = "rollout_tokens_per_second"
JOB_SAFE_MODE = "job_safe_mode"
CHECKPOINT_STEP = "checkpoint_committed_step"
CHECKPOINT_INFERENCE_VERSION = "checkpoint_inference_version"
CHECKPOINT_HISTORY = 12
# A framework integration's training signal shown when the job reports it (TRL's GRPO reward).
GRPO_REWARD = "grpo_reward_mean"


@dataclass(slots=True)
class ParticipantRow:
    role: str
    rank: int
    node: str | None
    phase: str
    step: int
    heartbeat_age: float
    level: str
    mark: str


@dataclass(slots=True)
class JobDetail:
    name: str
    participants: list[ParticipantRow]
    golden: list[ChartSpec]
    progress: list[ChartSpec]
    checkpoints: CheckpointVersions
    timeline: PhaseTimeline
    safe_mode: bool
    last_seen_age: float | None


def golden_thresholds(policy: Policy) -> list[tuple[str, float, float]]:
    """(metric, healthy, warning) of the golden metrics, from the loaded policy: the bands the
    detectors use are the bands the pages draw."""
    return [
        (metric, rule.healthy, rule.warning)
        for metric in GOLDEN_CHART_METRICS
        if (rule := policy.golden_metrics.get(metric)) is not None
    ]


def participant_rows(
    session: Session, *, job: str, now: float, suspect_after: float, confirm_after: float
) -> list[ParticipantRow]:
    """Raises ``NotFound`` (from the cluster service) for an unknown job."""
    detail = cluster.job_detail(session, name=job, now=now)
    return [
        ParticipantRow(
            role=p.role,
            rank=p.rank,
            node=p.node,
            phase=p.phase,
            step=p.step,
            heartbeat_age=p.heartbeat_age_seconds,
            level=liveness_level(
                p.heartbeat_age_seconds, suspect_after=suspect_after, confirm_after=confirm_after
            ),
            mark=liveness_mark(
                p.heartbeat_age_seconds, suspect_after=suspect_after, confirm_after=confirm_after
            ),
        )
        for p in detail.participant_list
    ]


def job_series(
    session: Session,
    store: SeriesStore,
    *,
    job: str,
    name: str,
    now: float,
    last: bool = False,
) -> dict[str, list[tuple[float, float]]]:
    """``{"role/rank": [(ts, value)]}`` over the last hour: rollups, then the live window.

    A rollup minute counts with its mean, or with its last value when ``last`` (versions and
    other values that only step: a mean of two versions is no version).
    """
    since = from_epoch(now) - timedelta(minutes=HISTORY_MINUTES)
    r = MetricRollup
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    # Few rows per job (participants x minutes), so the label filter runs here rather than as a
    # JSON expression that SQLite and PostgreSQL would spell differently.
    for labels, minute, avg in session.exec(
        select(r.labels, r.minute, r.last if last else r.avg)
        .where(r.name == name, r.minute >= since)
        .order_by(r.minute)  # type: ignore[arg-type]
    ).all():
        labels = labels or {}
        if labels.get("job") == job:
            out[_who(labels.get("role"), labels.get("rank"))].append(
                (minute.timestamp(), float(avg))
            )
    for key in store.keys(name=name):
        if key.label("job") != job:
            continue
        who = _who(key.label("role"), key.label("rank"))
        points = out[who]
        start = points[-1][0] + 60.0 if points else now - HISTORY_MINUTES * 60
        points.extend((p.ts, p.value) for p in store.since(key, start))
    return out


def _who(role: str | None, rank: str | int | None) -> str:
    if role is None and rank is None:
        return "job"
    return f"{role or '?'}/{rank if rank is not None else '?'}"


@dataclass(slots=True)
class CheckpointVersion:
    """A participant's last committed checkpoint: the version vector it reports."""

    who: str
    step: int
    inference_version: int | None
    reported_at: float


@dataclass(slots=True)
class CheckpointCommit:
    """A change of the committed version seen in the history (newest first on the page)."""

    at: float
    who: str
    step: int
    inference_version: int | None


@dataclass(slots=True)
class CheckpointVersions:
    current: list[CheckpointVersion]
    history: list[CheckpointCommit]


def _value_at(points: list[tuple[float, float]], ts: float) -> float | None:
    """The newest value at or before ``ts`` (points are in time order)."""
    found = None
    for at, value in points:
        if at > ts:
            break
        found = value
    return found


def checkpoint_versions(
    session: Session, store: SeriesStore, *, job: str, now: float
) -> CheckpointVersions:
    """Current (training_step, inference_version) per reporting participant, and the commits
    seen over the last hour, from the agents' checkpoint gauges (rollups + live window)."""
    steps = job_series(session, store, job=job, name=CHECKPOINT_STEP, now=now, last=True)
    versions = job_series(
        session, store, job=job, name=CHECKPOINT_INFERENCE_VERSION, now=now, last=True
    )
    current: list[CheckpointVersion] = []
    history: list[CheckpointCommit] = []
    for who in sorted(steps):
        points = steps[who]
        if not points:
            continue
        vpoints = versions.get(who, [])
        previous: float | None = None
        for at, value in points:
            if value != previous:
                version = _value_at(vpoints, at)
                history.append(
                    CheckpointCommit(
                        at=at,
                        who=who,
                        step=int(value),
                        inference_version=None if version is None else int(version),
                    )
                )
                previous = value
        at, value = points[-1]
        version = _value_at(vpoints, at)
        current.append(
            CheckpointVersion(
                who=who,
                step=int(value),
                inference_version=None if version is None else int(version),
                reported_at=at,
            )
        )
    history.sort(key=lambda c: c.at, reverse=True)
    return CheckpointVersions(current=current, history=history[:CHECKPOINT_HISTORY])


def golden_charts(
    session: Session, store: SeriesStore, *, job: str, now: float, policy: Policy
) -> list[ChartSpec]:
    charts = []
    for metric, healthy, warning in golden_thresholds(policy):
        title, unit = GOLDEN_CHART_METRICS[metric]
        spec = aligned_chart(
            title,
            dict(sorted(job_series(session, store, job=job, name=metric, now=now).items())),
            step_seconds=STEP_SECONDS,
            unit=unit,
        )
        if metric == SHARD_REBUILDS_5M:
            # A count: healthy means exactly 0, so the green band covers [0, 1).
            spec.bands = [
                Band(None, max(healthy, 0) + 1, "ok"),
                Band(max(healthy, 0) + 1, warning, "warn"),
                Band(warning, None, "bad"),
            ]
        else:
            spec.bands = golden_bands(healthy, warning)
        spec.thresholds = [
            Threshold(
                healthy, f"healthy {'≤' if metric == SHARD_REBUILDS_5M else '<'} {healthy:g}", "ok"
            ),
            Threshold(
                warning,
                f"warning {'≥' if metric == SHARD_REBUILDS_5M else '>'} {warning:g}",
                "warn",
            ),
        ]
        spec.y_min = 0.0
        charts.append(spec)
    return charts


def job_detail(
    *,
    session: Session,
    store: SeriesStore,
    name: str,
    now: float,
    suspect_after: float,
    confirm_after: float,
    policy: Policy,
) -> JobDetail:
    """Raises ``NotFound`` (from the cluster service) for an unknown job."""
    participants = participant_rows(
        session, job=name, now=now, suspect_after=suspect_after, confirm_after=confirm_after
    )
    job = session.exec(select(Job).where(Job.name == name)).one()
    progress = [
        aligned_chart(
            "Training step",
            dict(sorted(job_series(session, store, job=name, name=TRAIN_STEP, now=now).items())),
            step_seconds=STEP_SECONDS,
        ),
        aligned_chart(
            "Rollout tokens / s",
            dict(
                sorted(
                    job_series(session, store, job=name, name=TOKENS_PER_SECOND, now=now).items()
                )
            ),
            step_seconds=STEP_SECONDS,
            unit="tok/s",
        ),
    ]
    reward = dict(sorted(job_series(session, store, job=name, name=GRPO_REWARD, now=now).items()))
    if reward:
        chart = aligned_chart("GRPO reward (mean)", reward, step_seconds=STEP_SECONDS)
        chart.digits = 3
        progress.append(chart)
    safe = any(
        key.label("job") == name and (point := store.latest(key)) is not None and point.value >= 1
        for key in store.keys(name=JOB_SAFE_MODE)
    )
    return JobDetail(
        name=name,
        participants=participants,
        golden=golden_charts(session, store, job=name, now=now, policy=policy),
        progress=progress,
        checkpoints=checkpoint_versions(session, store, job=name, now=now),
        timeline=phase_timeline(session, job=name, now=now),
        safe_mode=safe,
        last_seen_age=None
        if job.last_seen_at is None
        else max(0.0, now - job.last_seen_at.timestamp()),
    )
