"""Job signals: the training processes' heartbeat files and the tail of the state log.

Reads ``<run_dir>/heartbeat/*.json`` (written by ``recovery.report.HeartbeatReporter``) and the
lines appended to ``<run_dir>/state_log.jsonl`` since the last round, and derives the golden
metrics per job/role/rank (names in ``docs/metrics.md``). A heartbeat file that is missing its
required fields or is not valid JSON (half-written by a foreign writer, corrupted) is skipped for
that round and logged once per file until it is readable again; it never stops the agent.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from agents.samples import Participant, Sample, make_sample
from recovery.launcher_reports import LAUNCH_DIRNAME
from recovery.protocol.metric_names import TRAINER_SIGNALS
from recovery.report import JOB_PATTERN, PHASE_PATTERN, safe_job_name
from recovery.tail import AppendedLines

log = logging.getLogger("rlguard.agent.job")

HEARTBEAT_DIRNAME = "heartbeat"
STATE_LOG_NAME = "state_log.jsonl"
REBUILD_WINDOW_S = 300.0
_MAX_HEARTBEAT_BYTES = 1 << 20
_STATE_LOG_INITIAL_TAIL = 64 * 1024  # on start, look back this far for the current state
_STATE_LOG_MAX_READ = 4 << 20  # per round, so a huge backlog cannot stall a round
# The ingest contract's rules for names: one participant that breaks them would get the whole
# batch (GPU samples included) refused, so such a heartbeat is skipped here instead.
_ID_RE = JOB_PATTERN
_PHASE_RE = PHASE_PATTERN
_MAX_RANK = 1_000_000
_MAX_STEP = 2**62
_MAX_FUTURE_S = 300.0
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


def _persist_error_sample(hb: Heartbeat, now: float, labels: dict[str, str]) -> Sample | None:
    """``snapshot_persist_last_error{dir, error}``; value: the error count it was last at (one
    series per distinct directory and error, which carry no snapshot's name)."""
    if hb.snapshot_persist_last_error is None:
        return None
    where, error = hb.snapshot_persist_last_error
    return make_sample(
        "snapshot_persist_last_error",
        hb.snapshot_persist_errors_total or 0,
        now,
        {**labels, "dir": where, "error": error},
    )


@dataclass
class _FileCache:
    key: tuple[int, int, int]  # (inode, size, mtime_ns): unchanged file, unchanged content
    heartbeat: Heartbeat


@dataclass
class _Rate:
    ts: float
    tokens: int


@dataclass
class _StateLogTail:
    """Reads only the complete lines appended since the last round."""

    path: Path
    transitions: int = 0
    last_ts: float | None = None
    last_state: str | None = None
    bad_lines: int = 0
    warned: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        # From the tail when first seen, so the agent learns the current state without reading
        # a long history.
        self._lines = AppendedLines(
            self.path, _STATE_LOG_MAX_READ, look_back=_STATE_LOG_INITIAL_TAIL
        )

    def poll(self) -> None:
        lines, first_open = self._lines.read()
        for line in lines:
            # What the log held before the agent first saw it is not a transition it saw happen.
            self._consume(line, count=not first_open)

    def _consume(self, line: bytes, *, count: bool) -> None:
        try:
            doc = orjson.loads(line)
            ts = doc.get("ts", doc.get("timestamp"))
            state = doc["state"]
            if (
                not isinstance(state, str)
                or isinstance(ts, bool)
                or not isinstance(ts, int | float)
            ):
                raise ValueError(f"bad ts/state in {line[:120]!r}")
        except (orjson.JSONDecodeError, KeyError, AttributeError, ValueError) as exc:
            self.bad_lines += 1
            if "line" not in self.warned:
                self.warned.add("line")
                log.warning("state log %s: skipping an unreadable line (%s)", self.path, exc)
            return
        if count:
            self.transitions += 1
        self.last_ts = float(ts)
        self.last_state = state


class JobCollector:
    """Turns the run directory's heartbeat files and state log into job samples and participants.

    ``clock`` is the agent's wall clock (heartbeat ages are computed against it). Job samples
    never carry ``simulated="1"``: they come from real files even when the GPUs are simulated.
    """

    def __init__(self, run_dir: Path, *, clock: Callable[[], float] = time.time) -> None:
        self._run_dir = Path(run_dir)
        self._heartbeat_dir = self._run_dir / HEARTBEAT_DIRNAME
        self._default_job = safe_job_name(self._run_dir.resolve().name)
        self._clock = clock
        self._cache: dict[str, _FileCache] = {}
        self._rates: dict[tuple[str, str, int], _Rate] = {}
        # launch declaration file -> (stat key, pid, first-step budget)
        self._declarations: dict[str, tuple[tuple[int, int, int], Any, float | None]] = {}
        self._bad_files: set[str] = set()
        self._state_log = _StateLogTail(self._run_dir / STATE_LOG_NAME)
        self._job_name: str | None = None
        self.skipped_last_round = 0

    def collect(self) -> tuple[list[Sample], list[Participant]]:
        """Read the heartbeats and state log once; return this round's samples and participants."""
        now = self._clock()
        samples: list[Sample] = []
        participants: list[Participant] = []
        heartbeats = self._read_heartbeats(now)
        for hb in heartbeats:
            self._job_name = self._job_name or hb.job
            self._derive(hb, now, samples)
            participants.append(
                {
                    "job": hb.job,
                    "role": hb.role,
                    "rank": hb.rank,
                    "phase": hb.phase,
                    "step": hb.step if hb.step is not None else 0,
                    "ts": hb.ts,
                }
            )
        self._collect_state_log(now, samples)
        return samples, participants

    def _read_heartbeats(self, now: float) -> list[Heartbeat]:
        out: list[Heartbeat] = []
        seen: set[str] = set()
        skipped = 0
        try:
            entries = list(os.scandir(self._heartbeat_dir))
        except FileNotFoundError:
            entries = []
        for entry in entries:
            name = entry.name
            if name.startswith(".") or not name.endswith(".json"):
                continue
            seen.add(name)
            try:
                st = entry.stat()
                key = (st.st_ino, st.st_size, st.st_mtime_ns)
                cached = self._cache.get(name)
                if cached is not None and cached.key == key:
                    out.append(cached.heartbeat)
                    continue
                if st.st_size > _MAX_HEARTBEAT_BYTES:
                    raise HeartbeatInvalid(f"{st.st_size} bytes, more than {_MAX_HEARTBEAT_BYTES}")
                with open(entry.path, "rb") as handle:
                    raw = handle.read(_MAX_HEARTBEAT_BYTES + 1)
                hb = parse_heartbeat(raw, self._default_job)
                if hb.ts > now + _MAX_FUTURE_S:
                    # The server refuses a batch with a participant this far ahead: skip it here.
                    raise HeartbeatInvalid(
                        f"ts {hb.ts} is more than {_MAX_FUTURE_S:g} s in the future"
                    )
            except FileNotFoundError:
                continue  # replaced or removed between listing and reading
            except (HeartbeatInvalid, OSError) as exc:
                skipped += 1
                self._cache.pop(name, None)
                if name not in self._bad_files:
                    self._bad_files.add(name)
                    log.warning("heartbeat %s skipped: %s", entry.path, exc)
                continue
            if name in self._bad_files:
                self._bad_files.discard(name)
                log.info("heartbeat %s is readable again", entry.path)
            self._cache[name] = _FileCache(key, hb)
            out.append(hb)
        for gone in set(self._cache) - seen:
            del self._cache[gone]
        self.skipped_last_round = skipped
        return out

    def _derive(self, hb: Heartbeat, now: float, out: list[Sample]) -> None:
        labels = {"job": hb.job, "role": hb.role, "rank": str(hb.rank)}

        def add(name: str, value: float) -> None:
            out.append(make_sample(name, value, now, labels))

        add("participant_heartbeat_age_seconds", max(0.0, now - hb.ts))
        if hb.pid is not None:
            # A new value is a new process: a restart its phases may not show (a quick restart
            # by the job's own launcher, resumed at the same step).
            add("participant_pid", hb.pid)
        if hb.updated_at is not None:
            add("participant_progress_age_seconds", max(0.0, now - hb.updated_at))
        if hb.step is not None:
            add("train_step", hb.step)
        if hb.rollouts_pending is not None:
            add("rollout_pending_count", hb.rollouts_pending)
        if hb.rollouts_scheduled is not None:
            add("rollout_scheduled_count", hb.rollouts_scheduled)
            if hb.rollouts_scheduled > 0 and hb.rollouts_pending is not None:
                add("rollout_pending_ratio", hb.rollouts_pending / hb.rollouts_scheduled)
        if hb.shard_rebuilds_total is not None:
            add("actor_shard_rebuilds_total", hb.shard_rebuilds_total)
            recent = sum(1 for t in hb.shard_rebuilds if now - t <= REBUILD_WINDOW_S)
            add("actor_shard_rebuild_count_5m", recent)
        if hb.state_log_write_latency_ms is not None:
            add("state_log_write_latency_ms", hb.state_log_write_latency_ms)
        for name, value in (
            ("train_step_failures_total", hb.train_step_failures_total),
            ("train_last_failed_step", hb.train_last_failed_step),
            ("rollout_batch_timeouts_total", hb.rollout_batch_timeouts_total),
            ("state_log_write_errors_total", hb.state_log_write_errors_total),
            ("checkpoint_write_errors_total", hb.checkpoint_write_errors_total),
            ("snapshot_persist_errors_total", hb.snapshot_persist_errors_total),
            ("checkpoint_committed_step", hb.checkpoint_step),
            ("checkpoint_inference_version", hb.checkpoint_inference_version),
        ):
            if value is not None:
                add(name, value)
        if hb.stale_shards is not None:
            add("actor_shard_stale", 1 if hb.stale_shards else 0)
        for signal, reading in hb.signals:
            add(signal, reading)
        if hb.rollout_failed_samples_total is not None:
            add("rollout_failed_samples_total", hb.rollout_failed_samples_total)
        if hb.rollout_samples_total is not None:
            add("rollout_samples_total", hb.rollout_samples_total)
        budget = hb.first_step_budget_seconds or self._declared_budget(hb)
        if budget is not None:
            add("participant_first_step_budget_seconds", budget)
        if hb.exit_cause is not None:
            cause, kind, line = hb.exit_cause
            # Value: when the process exited (its heartbeat's time), so a reader tells this
            # exit's cause from an earlier one's.
            out.append(
                make_sample(
                    "participant_exit_cause",
                    hb.ts,
                    now,
                    {**labels, "cause": cause, "kind": kind, "line": line},
                )
            )
        if (last_error := _persist_error_sample(hb, now, labels)) is not None:
            out.append(last_error)
        if hb.tokens_generated is not None:
            add("rollout_tokens_generated_total", hb.tokens_generated)
            key = (hb.job, hb.role, hb.rank)
            previous = self._rates.get(key)
            if previous is None or hb.ts != previous.ts:
                self._rates[key] = _Rate(hb.ts, hb.tokens_generated)
            if (
                previous is not None
                and hb.ts > previous.ts
                and hb.tokens_generated >= previous.tokens
            ):
                add(
                    "rollout_tokens_per_second",
                    (hb.tokens_generated - previous.tokens) / (hb.ts - previous.ts),
                )

    def _declared_budget(self, hb: Heartbeat) -> float | None:
        """The first-step budget its launcher declared for this process (``rlguard launch
        --first-step-budget``: ``<run_dir>/launch/<role>-<rank>.json``, for one pid)."""
        path = self._run_dir / LAUNCH_DIRNAME / f"{hb.role}-{hb.rank}.json"
        try:
            st = path.stat()
        except OSError:
            return None
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        cached = self._declarations.get(path.name)
        if cached is None or cached[0] != key:
            pid: Any = None
            budget: float | None = None
            try:
                doc = orjson.loads(path.read_bytes()[:4096])
                pid, raw = doc.get("pid"), doc.get("first_step_budget_seconds")
                if isinstance(raw, int | float) and not isinstance(raw, bool) and 0 < raw < math.inf:
                    budget = float(raw)
            except (OSError, orjson.JSONDecodeError, AttributeError):
                pass  # a declaration being replaced or broken: the policy's budget meanwhile
            cached = (key, pid, budget)
            self._declarations[path.name] = cached
        return cached[2] if cached[1] == hb.pid and hb.pid is not None else None

    def _collect_state_log(self, now: float, out: list[Sample]) -> None:
        tail = self._state_log
        tail.poll()
        if tail.last_ts is None:
            return
        labels = {"job": self._job_name or self._default_job}
        out.append(make_sample("job_state_transitions_total", tail.transitions, now, labels))
        out.append(
            make_sample("job_state_log_age_seconds", max(0.0, now - tail.last_ts), now, labels)
        )
        out.append(
            make_sample("job_safe_mode", 1 if tail.last_state == "SAFE_MODE" else 0, now, labels)
        )
