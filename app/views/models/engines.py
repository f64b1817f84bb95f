"""The Job page's engine panel: each rollout engine of the job as its router and the agent see it.

A row per rollout participant of a job that runs inference engines (it reports any engine
figure): its admission (from the phase its host reports: ``ROLLOUT`` admitted, ``REFIT``
refitting, ``STARTING``, ``QUARANTINED``, ``EXITED`` dead), the trainer step whose weights it
serves, its train/inference disagreement (``rollout_logprob_diff_mean`` / ``_max``), and its
live vLLM figures where the agent scrapes the engine (requests running and waiting, KV-cache
usage, tokens/s, preemptions). A job without engines has no panel.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlmodel import Session

from app.cluster import queries as cluster
from app.series.store import SeriesStore
from recovery.protocol import metric_names as m

# The host's heartbeat phase -> (what the router did with the engine, badge level)
ADMISSION = {
    "ROLLOUT": ("admitted", "ok"),
    "REFIT": ("refitting", "warn"),
    "STARTING": ("starting", "warn"),
    "QUARANTINED": ("quarantined", "bad"),
    "EXITED": ("dead", "bad"),
}
FIGURES = {
    "diff_mean": m.ROLLOUT_LOGPROB_DIFF_MEAN,
    "diff_max": m.ROLLOUT_LOGPROB_DIFF_MAX,
    "running": m.ROLLOUT_ENGINE_REQUESTS_RUNNING,
    "waiting": m.ROLLOUT_ENGINE_REQUESTS_WAITING,
    "kv_usage": m.ROLLOUT_ENGINE_KV_CACHE_USAGE,
    "tokens_per_s": m.ROLLOUT_TOKENS_PER_SECOND,
    "preemptions": m.ROLLOUT_ENGINE_PREEMPTIONS,
}
# What makes a job's rollouts engines (the token rate is every rollout's, engine or not).
ENGINE_FIGURES = frozenset(FIGURES) - {"tokens_per_s"}


@dataclass(slots=True)
class EngineRow:
    rank: int
    node: str | None
    phase: str
    admission: str
    level: str
    serves_step: int
    figures: dict[str, float]


def engine_rows(session: Session, store: SeriesStore, *, job: str, now: float) -> list[EngineRow]:
    """The job's engines (empty: it runs none). Raises ``NotFound`` for an unknown job."""
    detail = cluster.job_detail(session, name=job, now=now)
    latest: dict[int, dict[str, float]] = {}
    for field, name in FIGURES.items():
        for key in store.keys(name=name):
            if key.label(m.LABEL_JOB) != job or key.label(m.LABEL_ROLE) != "rollout":
                continue
            rank = key.label(m.LABEL_RANK)
            point = store.latest(key)
            if point is None or rank is None or not rank.isdigit():
                continue
            latest.setdefault(int(rank), {})[field] = point.value
    if not any(ENGINE_FIGURES & set(f) for f in latest.values()):
        return []
    rows = []
    for p in detail.participant_list:
        if p.role != "rollout":
            continue
        admission, level = ADMISSION.get(p.phase, (p.phase.lower(), "warn"))
        rows.append(
            EngineRow(
                rank=p.rank,
                node=p.node,
                phase=p.phase,
                admission=admission,
                level=level,
                serves_step=p.step,
                figures=latest.get(p.rank, {}),
            )
        )
    return sorted(rows, key=lambda r: r.rank)
