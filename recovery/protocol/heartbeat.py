"""The heartbeat document: what a participant's heartbeat file says, as the node agent reads it.

``recovery.report.HeartbeatReporter`` writes ``<run_dir>/heartbeat/<role>-<rank>.json``; the
agent (``agents/collectors/job.py``) reads it with :func:`parse_heartbeat` into a
:class:`Heartbeat`. A document that breaks a rule of the ingest contract (a name, a rank, a
count) raises :class:`HeartbeatInvalid` naming the field: one bad participant would otherwise get
the node's whole batch refused. ``tests/unit/recovery/protocol/test_heartbeat.py`` pins that
every field the reporter writes is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import orjson

from recovery.protocol.metric_names import TRAINER_SIGNALS
from recovery.report import JOB_PATTERN, PHASE_PATTERN

__all__ = ["Heartbeat", "HeartbeatInvalid", "parse_heartbeat"]

# The ingest contract's rules for names: one participant that breaks them would get the whole
# batch (GPU samples included) refused, so such a heartbeat is skipped here instead.
_ID_RE = JOB_PATTERN
_PHASE_RE = PHASE_PATTERN
_MAX_RANK = 1_000_000
_MAX_STEP = 2**62
_MAX_CAUSE_LINE = 120


class HeartbeatInvalid(ValueError):
    """A heartbeat document that cannot be used this round (the message says why)."""


@dataclass(frozen=True)
class Heartbeat:
    """The fields of one heartbeat file that the agent uses."""

    job: str
    role: str
    rank: int
    phase: str
    ts: float
    updated_at: float | None
    step: int | None
    tokens_generated: int | None
    rollouts_pending: int | None
    rollouts_scheduled: int | None
    shard_rebuilds: tuple[float, ...]
    shard_rebuilds_total: int | None
    state_log_write_latency_ms: float | None
    # Faults the participant reports itself (None: a heartbeat without the field).
    train_step_failures_total: int | None = None
    train_last_failed_step: int | None = None
    rollout_batch_timeouts_total: int | None = None
    stale_shards: tuple[str, ...] | None = None
    state_log_write_errors_total: int | None = None
    checkpoint_write_errors_total: int | None = None
    # The last committed checkpoint's version vector (None until one committed).
    checkpoint_step: int | None = None
    checkpoint_inference_version: int | None = None
    # A framework's training metrics (``signals``): only the names in TRAINER_SIGNALS.
    signals: tuple[tuple[str, float], ...] = ()
    # Why the process failed, as its launcher read it in the process's own output (cause,
    # kind, line: recovery/supervision/exit_causes.py); None: no exit, or no known cause.
    exit_cause: tuple[str, str, str] | None = None
    pid: int | None = None
    # The process's own first-step hang budget (heartbeat API), None: not declared there.
    first_step_budget_seconds: float | None = None
    rollout_failed_samples_total: int | None = None
    rollout_samples_total: int | None = None
    # Every-step snapshots not persisted, and the last one's (directory, error).
    snapshot_persist_errors_total: int | None = None
    snapshot_persist_last_error: tuple[str, str] | None = None


def _number(doc: dict[str, Any], key: str) -> float | None:
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise HeartbeatInvalid(f"field {key!r} is not a finite number: {value!r}")
    return float(value)


def _count(doc: dict[str, Any], key: str) -> int | None:
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise HeartbeatInvalid(f"field {key!r} is not a count: {value!r}")
    return value


def _signals(doc: dict[str, Any]) -> tuple[tuple[str, float], ...]:
    """The known training signals of the heartbeat; names the agent does not know are left out
    (a newer integration may publish more than this agent forwards)."""
    raw = doc.get("signals")
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise HeartbeatInvalid(f"field 'signals' is not an object: {raw!r}")
    out = []
    for name in sorted(TRAINER_SIGNALS.intersection(raw)):
        value = _number(raw, name)
        if value is not None:
            out.append((name, value))
    return tuple(out)


def _exit_cause(doc: dict[str, Any]) -> tuple[str, str, str] | None:
    raw = doc.get("exit_cause")
    if raw is None:
        return None
    fields = raw if isinstance(raw, dict) else {}
    cause, kind, line = fields.get("cause"), fields.get("kind"), fields.get("line")
    if not (
        isinstance(cause, str)
        and _ID_RE.fullmatch(cause)
        and isinstance(kind, str)
        and _ID_RE.fullmatch(kind)
        and isinstance(line, str)
    ):
        raise HeartbeatInvalid(f"field 'exit_cause' is not a cause, kind and line: {raw!r}")
    # The line is a label value: the contract's limit (128), NUL-free.
    return cause, kind, line.replace("\x00", "")[:_MAX_CAUSE_LINE]


def _persist_error(doc: dict[str, Any]) -> tuple[str, str] | None:
    raw = doc.get("snapshot_persist_last_error")
    if raw is None:
        return None
    fields = raw if isinstance(raw, dict) else {}
    directory, error = fields.get("dir"), fields.get("error")
    if not (isinstance(directory, str) and isinstance(error, str)):
        raise HeartbeatInvalid(
            f"field 'snapshot_persist_last_error' is not a dir and an error: {raw!r}"
        )
    # Label values: the contract's limit (128), NUL-free; a path's end names it best.
    return (
        directory.replace("\x00", "")[-_MAX_CAUSE_LINE:],
        error.replace("\x00", "")[:_MAX_CAUSE_LINE],
    )


def parse_heartbeat(raw: bytes, default_job: str) -> Heartbeat:
    """Parse one heartbeat file's bytes; raise :class:`HeartbeatInvalid` naming the problem."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise HeartbeatInvalid(f"not valid JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise HeartbeatInvalid(f"not a JSON object but {type(doc).__name__}")
    role = doc.get("role")
    if not isinstance(role, str) or not role:
        raise HeartbeatInvalid(f"field 'role' missing or not a string: {role!r}")
    rank = _count(doc, "rank")
    if rank is None:
        raise HeartbeatInvalid("field 'rank' missing")
    ts = _number(doc, "ts")
    if ts is None:
        raise HeartbeatInvalid("field 'ts' missing")
    if not _ID_RE.fullmatch(role):
        raise HeartbeatInvalid(f"field 'role' is not a valid identifier: {role!r}")
    if rank > _MAX_RANK:
        raise HeartbeatInvalid(f"field 'rank' is above {_MAX_RANK}: {rank!r}")
    job = doc.get("job")
    if job is not None and (not isinstance(job, str) or not _ID_RE.fullmatch(job)):
        raise HeartbeatInvalid(f"field 'job' is not a valid identifier: {job!r}")
    phase = doc.get("phase")
    if phase is not None and (not isinstance(phase, str) or not _PHASE_RE.fullmatch(phase)):
        raise HeartbeatInvalid(f"field 'phase' is not a valid phase name: {phase!r}")
    step = _count(doc, "step")
    if step is not None and step > _MAX_STEP:
        raise HeartbeatInvalid(f"field 'step' is above 2**62: {step!r}")
    rebuilds = doc.get("shard_rebuilds") or []
    if not isinstance(rebuilds, list) or not all(
        isinstance(t, int | float) and not isinstance(t, bool) for t in rebuilds
    ):
        raise HeartbeatInvalid(f"field 'shard_rebuilds' is not a list of timestamps: {rebuilds!r}")
    stale = doc.get("stale_shards")
    if stale is not None and (
        not isinstance(stale, list) or not all(isinstance(s, str) and s for s in stale)
    ):
        raise HeartbeatInvalid(f"field 'stale_shards' is not a list of shard ids: {stale!r}")
    last_failed = _count(doc, "train_last_failed_step")
    if last_failed is not None and last_failed > _MAX_STEP:
        raise HeartbeatInvalid(f"field 'train_last_failed_step' is above 2**62: {last_failed!r}")
    return Heartbeat(
        job=job if isinstance(job, str) and job else default_job,
        role=role,
        rank=rank,
        phase=phase if isinstance(phase, str) and phase else "UNKNOWN",
        ts=ts,
        updated_at=_number(doc, "updated_at"),
        step=step,
        tokens_generated=_count(doc, "tokens_generated"),
        rollouts_pending=_count(doc, "rollouts_pending"),
        rollouts_scheduled=_count(doc, "rollouts_scheduled"),
        shard_rebuilds=tuple(float(t) for t in rebuilds),
        shard_rebuilds_total=_count(doc, "shard_rebuilds_total"),
        state_log_write_latency_ms=_number(doc, "state_log_write_latency_ms"),
        train_step_failures_total=_count(doc, "train_step_failures_total"),
        train_last_failed_step=last_failed,
        rollout_batch_timeouts_total=_count(doc, "rollout_batch_timeouts_total"),
        stale_shards=tuple(stale) if stale is not None else None,
        state_log_write_errors_total=_count(doc, "state_log_write_errors_total"),
        checkpoint_write_errors_total=_count(doc, "checkpoint_write_errors_total"),
        checkpoint_step=_count(doc, "checkpoint_step"),
        checkpoint_inference_version=_count(doc, "checkpoint_inference_version"),
        signals=_signals(doc),
        exit_cause=_exit_cause(doc),
        pid=_count(doc, "pid"),
        first_step_budget_seconds=_positive(doc, "first_step_budget_seconds"),
        rollout_failed_samples_total=_count(doc, "rollout_failed_samples_total"),
        rollout_samples_total=_count(doc, "rollout_samples_total"),
        snapshot_persist_errors_total=_count(doc, "snapshot_persist_errors_total"),
        snapshot_persist_last_error=_persist_error(doc),
    )


def _positive(doc: dict[str, Any], key: str) -> float | None:
    value = _number(doc, key)
    if value is not None and value <= 0:
        raise HeartbeatInvalid(f"field {key!r} is not a positive number: {value!r}")
    return value
