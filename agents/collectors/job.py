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

from recovery.launcher_reports import LAUNCH_DIRNAME
from recovery.protocol.heartbeat import Heartbeat, HeartbeatInvalid, parse_heartbeat
from recovery.protocol.samples import ParticipantReport, Sample, make_sample
from recovery.report import safe_job_name
from recovery.tail import AppendedLines

log = logging.getLogger("rlguard.agent.job")

HEARTBEAT_DIRNAME = "heartbeat"
STATE_LOG_NAME = "state_log.jsonl"
REBUILD_WINDOW_S = 300.0
_MAX_HEARTBEAT_BYTES = 1 << 20
_STATE_LOG_INITIAL_TAIL = 64 * 1024  # on start, look back this far for the current state
_STATE_LOG_MAX_READ = 4 << 20  # per round, so a huge backlog cannot stall a round
_MAX_FUTURE_S = 300.0


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

    def collect(self) -> tuple[list[Sample], list[ParticipantReport]]:
        """Read the heartbeats and state log once; return this round's samples and participants."""
        now = self._clock()
        samples: list[Sample] = []
        participants: list[ParticipantReport] = []
        heartbeats = self._read_heartbeats(now)
        for hb in heartbeats:
            self._job_name = self._job_name or hb.job
            self._derive(hb, now, samples)
            step = hb.step if hb.step is not None else 0
            participants.append(ParticipantReport(hb.job, hb.role, hb.rank, hb.phase, step, hb.ts))
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
                if (
                    isinstance(raw, int | float)
                    and not isinstance(raw, bool)
                    and 0 < raw < math.inf
                ):
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
