"""Heartbeat files that training processes write for the node agent.

Each training process owns one file, ``<run_dir>/heartbeat/<role>-<rank>.json``, replaced
atomically so the agent never reads half a file (``docs/metrics.md``: what the agent makes of
it). ``update`` merges what the training code knows now and writes at most once per
``interval``; ``start_keepalive`` rewrites the file every ``interval`` from a thread, so a long
step does not look like a dead process (``updated_at`` still tells how old the progress is).
Every public method is thread-safe.

Faults the process sees itself are counted and written at once: ``record_step_failure``,
``record_rollout_timeout``, ``set_shard_stale``, ``record_state_log_error``,
``record_checkpoint_error``, ``record_snapshot_persist_error`` (a
:class:`recovery.phases.PhaseMachine` feeds the first, second and fourth). The counters are
cumulative; ``restore_fault_counts`` carries them over a restart. ``record_checkpoint``
publishes the last committed checkpoint's version vector; ``set_signals`` a framework's own
metrics, forwarded by name (``recovery/protocol/metric_names.py``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from recovery._closing import ClosesOnExit
from recovery.errors import RecoveryError, RecoveryTimeout
from recovery.fsio import replace_file

log = logging.getLogger("rlguard.recovery.report")

HEARTBEAT_FORMAT = 1
HEARTBEAT_DIRNAME = "heartbeat"
# The golden metric counts rebuilds over five minutes; older timestamps are not carried.
SHARD_REBUILD_WINDOW_S = 300.0
_MAX_REBUILD_TIMESTAMPS = 256
_ROLE_PATTERN = re.compile(r"^[A-Za-z0-9_.]{1,64}$")  # no "-": it separates role from rank
# The server's ingest rules for job names and phases; a heartbeat that breaks them is skipped by
# the agent, so the reporter refuses such values up front.
JOB_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:@/-]{0,127}$")
PHASE_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
# A signal's name is the metric name the agent sends it under (Prometheus' rules, lower case).
SIGNAL_PATTERN = re.compile(r"^[a-z_][a-z0-9_]{0,63}$")
_MAX_SIGNALS = 32
# Cumulative fault counters a restarted process takes over from its predecessor's heartbeat.
_CARRIED_COUNTERS = (
    "train_step_failures_total",
    "rollout_batch_timeouts_total",
    "state_log_write_errors_total",
    "checkpoint_write_errors_total",
    "snapshot_persist_errors_total",
)
_MAX_ERROR_TEXT = 120  # the agent sends the last persist error's text as label values
_UNSET: Any = object()
# The phase a launcher writes for a process it saw exit (app policy: detection.heartbeat.
# exited_phases), and for one it started that has not reported yet.
EXITED_PHASE = "EXITED"
STARTING_PHASE = "STARTING"
# Phases of a process that has not reported a step of its own yet: the reporter's first
# heartbeat (INIT) and its launcher's while it starts.
START_PHASES = frozenset({"INIT", STARTING_PHASE})
DONE_PHASE = "DONE"
# Phases of a process that finished on purpose (app policy: detection.heartbeat.finished_phases).
FINISHED_PHASES = ("DONE", "STOPPED", "FINISHED")


class HeartbeatError(RecoveryError, ValueError):
    """Bad arguments to :class:`HeartbeatReporter`, or its file could not be written."""


def safe_job_name(name: str) -> str:
    """``name`` (e.g. a run directory's name) turned into a valid job name."""
    cleaned = re.sub(r"[^A-Za-z0-9_.:@/-]", "_", name)[:128]
    if not JOB_PATTERN.fullmatch(cleaned):
        cleaned = ("_" + cleaned)[:128]
    return cleaned


def heartbeat_path(run_dir: str | os.PathLike[str], role: str, rank: int) -> Path:
    """Return the heartbeat file of ``role``/``rank`` inside ``run_dir``."""
    return Path(run_dir) / HEARTBEAT_DIRNAME / f"{role}-{rank}.json"


def _check_count(name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise HeartbeatError(f"{name} must be an int or None, got {value!r}")
    if value < 0:
        raise HeartbeatError(f"{name} must be >= 0, got {value!r}")
    return value


def _check_finite(value: object) -> float | None:
    """``value`` as a float if it is a finite number >= 0, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if 0.0 <= number < float("inf") else None


def _check_latency(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise HeartbeatError(f"state_log_latency_ms must be a number or None, got {value!r}")
    number = float(value)
    if not (number >= 0.0 and number != float("inf")):
        raise HeartbeatError(f"state_log_latency_ms must be finite and >= 0, got {value!r}")
    return number


class HeartbeatReporter(ClosesOnExit):
    """Writes one participant's heartbeat file; training code calls it, the node agent reads it.

    ``run_dir`` is the job's run directory, ``role`` a short name without ``-`` (``trainer``,
    ``rollout``), ``rank`` the participant's rank. ``job`` defaults to the run directory's name.
    ``interval`` bounds how often ``update`` writes (seconds); ``clock`` returns wall-clock seconds
    and is injectable for tests. ``lock_timeout`` bounds every wait for the internal lock.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        role: str,
        rank: int,
        *,
        job: str | None = None,
        interval: float = 2.0,
        clock: Callable[[], float] = time.time,
        pid: int | None = None,
        lock_timeout: float = 5.0,
    ) -> None:
        if not isinstance(role, str) or not _ROLE_PATTERN.fullmatch(role):
            raise HeartbeatError(f"role must be 1-64 of [A-Za-z0-9_.] (no '-'), got {role!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise HeartbeatError(f"rank must be an int >= 0, got {rank!r}")
        if (
            isinstance(interval, bool)
            or not isinstance(interval, int | float)
            or not (0 < interval < float("inf"))
        ):
            raise HeartbeatError(f"interval must be a positive number of seconds, got {interval!r}")
        if job is not None and (not isinstance(job, str) or not JOB_PATTERN.fullmatch(job)):
            raise HeartbeatError(
                f"job must be 1-128 letters, digits or _.:@/- (not starting with punctuation) "
                f"or None, got {job!r}"
            )
        if not (isinstance(lock_timeout, int | float) and lock_timeout > 0):
            raise HeartbeatError(f"lock_timeout must be a positive number, got {lock_timeout!r}")
        self._run_dir = Path(run_dir)
        self._path = heartbeat_path(run_dir, role, rank)
        self._interval = float(interval)
        self._clock = clock
        self._lock = threading.Lock()
        self._lock_timeout = float(lock_timeout)
        self._last_write = float("-inf")
        self._stop = threading.Event()
        self._keepalive: threading.Thread | None = None
        self._rebuilds: deque[float] = deque(maxlen=_MAX_REBUILD_TIMESTAMPS)
        self._state: dict[str, Any] = {
            "format": HEARTBEAT_FORMAT,
            "job": job if job is not None else safe_job_name(self._run_dir.resolve().name),
            "role": role,
            "rank": rank,
            "pid": os.getpid() if pid is None else int(pid),
            "phase": "INIT",
            "step": None,
            "tokens_generated": None,
            "rollouts_pending": None,
            "rollouts_scheduled": None,
            "shard_rebuilds": [],
            "shard_rebuilds_total": 0,
            "state_log_write_latency_ms": None,
            "train_step_failures_total": 0,
            "train_last_failed_step": None,
            "rollout_batch_timeouts_total": 0,
            "stale_shards": [],
            "state_log_write_errors_total": 0,
            "checkpoint_write_errors_total": 0,
            # snapshots not persisted; the last one's {"dir", "error"} (label values: kept short)
            "snapshot_persist_errors_total": 0,
            "snapshot_persist_last_error": None,
            "checkpoint_step": None,
            "checkpoint_inference_version": None,
            "signals": {},
            # The job's own first-step hang budget (seconds), None: the policy's default.
            "first_step_budget_seconds": None,
            # Generations that failed or came back empty (a rollout's; None until the first).
            "rollout_failed_samples_total": None,
            # Generations finished, failed ones included (the failure ratio's denominator).
            "rollout_samples_total": None,
            "updated_at": clock(),
            "ts": None,
        }
        self._path.parent.mkdir(parents=True, exist_ok=True)

    @property
    def path(self) -> Path:
        """The heartbeat file this reporter writes."""
        return self._path

    @contextmanager
    def _holding_lock(self) -> Iterator[None]:
        if not self._lock.acquire(timeout=self._lock_timeout):
            raise RecoveryTimeout(
                f"heartbeat reporter lock for {self._path} not acquired within {self._lock_timeout}s"
            )
        try:
            yield
        finally:
            self._lock.release()

    def update(
        self,
        *,
        phase: str | None = None,
        step: int | None = _UNSET,
        tokens: int | None = _UNSET,
        pending: int | None = _UNSET,
        scheduled: int | None = _UNSET,
        state_log_latency_ms: float | None = _UNSET,
        force: bool = False,
    ) -> bool:
        """Merge the given fields into the heartbeat; write it if ``interval`` has passed.

        ``tokens`` is the cumulative number of tokens generated by this participant. A field left
        out keeps its previous value; passing ``None`` clears it. Returns True when the file was
        written by this call (``force=True`` always writes). Bad values raise
        :class:`HeartbeatError` and change nothing.
        """
        changes: dict[str, Any] = {}
        if phase is not None:
            if not isinstance(phase, str) or not PHASE_PATTERN.fullmatch(phase):
                raise HeartbeatError(
                    f"phase must be a name of letters, digits and _ (at most 64), got {phase!r}"
                )
            changes["phase"] = phase
        for key, name, value in (
            ("step", "step", step),
            ("tokens_generated", "tokens", tokens),
            ("rollouts_pending", "pending", pending),
            ("rollouts_scheduled", "scheduled", scheduled),
        ):
            if value is not _UNSET:
                changes[key] = _check_count(name, value)
        if state_log_latency_ms is not _UNSET:
            changes["state_log_write_latency_ms"] = _check_latency(state_log_latency_ms)
        with self._holding_lock():
            self._state.update(changes)
            self._state["updated_at"] = self._clock()
            return self._write_if_due_locked(force)

    def add_tokens(self, count: int) -> bool:
        """Add ``count`` generated tokens to the cumulative total; write if ``interval`` has passed."""
        checked = _check_count("count", count)
        with self._holding_lock():
            self._state["tokens_generated"] = (self._state["tokens_generated"] or 0) + (
                checked or 0
            )
            self._state["updated_at"] = self._clock()
            return self._write_if_due_locked(False)

    def record_shard_rebuild(self, ts: float | None = None) -> bool:
        """Record one actor shard rebuild (at ``ts``, default now) and write the heartbeat at once.

        Rebuilds are rare and feed ``actor_shard_rebuild_count_5m``, so they are not held back by
        the write interval.
        """
        checked = None if ts is None or isinstance(ts, bool) else _check_finite(ts)
        if ts is not None and checked is None:
            raise HeartbeatError(f"ts must be a finite number of seconds >= 0, got {ts!r}")
        when = self._clock() if checked is None else checked
        with self._holding_lock():
            self._rebuilds.append(when)
            self._state["shard_rebuilds_total"] += 1
            self._state["updated_at"] = self._clock()
            return self._write_if_due_locked(True)

    def record_step_failure(self, step: int) -> bool:
        """Count one failed train step (an OOM ...) at ``step`` and write the heartbeat at once."""
        checked = _check_count("step", step)
        if checked is None:
            raise HeartbeatError("step must be an int >= 0, got None")
        return self._bump_fault(train_step_failures_total=1, train_last_failed_step=checked)

    def record_rollout_timeout(self) -> bool:
        """Count one rollout batch that timed out and write the heartbeat at once."""
        return self._bump_fault(rollout_batch_timeouts_total=1)

    def record_state_log_error(self) -> bool:
        """Count one state-log append that failed (storage not writable) and write at once.

        The heartbeat file usually lives on the same storage: when it cannot be written either,
        this raises :class:`HeartbeatError` and the agent sees the heartbeat age grow instead.
        """
        return self._bump_fault(state_log_write_errors_total=1)

    def record_checkpoint_error(self) -> bool:
        """Count one checkpoint save that failed (its storage refused the write) and write at
        once. The job goes on without that checkpoint; the policy engine reads the counter as
        storage that is not writable."""
        return self._bump_fault(checkpoint_write_errors_total=1)

    def record_snapshot_persist_error(self, directory: str, error: str) -> bool:
        """Count one snapshot not persisted to ``directory`` (full, unwritable ...) for ``error``;
        write at once. Training goes on: the policy engine opens ``checkpoint_write_errors``."""
        last = {"dir": str(directory)[-_MAX_ERROR_TEXT:], "error": str(error)[:_MAX_ERROR_TEXT]}
        return self._bump_fault(snapshot_persist_errors_total=1, snapshot_persist_last_error=last)

    def set_shard_stale(self, shard_id: str, stale: bool) -> bool:
        """Mark actor shard ``shard_id`` stale (it gets no new rollouts) or live again.

        Writes the heartbeat at once when the set of stale shards changed; returns whether it
        wrote.
        """
        if not isinstance(shard_id, str) or not _ROLE_PATTERN.fullmatch(shard_id):
            raise HeartbeatError(f"shard_id must be 1-64 of [A-Za-z0-9_.], got {shard_id!r}")
        if not isinstance(stale, bool):
            raise HeartbeatError(f"stale must be a bool, got {stale!r}")
        with self._holding_lock():
            shards = set(self._state["stale_shards"])
            if (shard_id in shards) == stale:
                return False
            shards.symmetric_difference_update({shard_id})
            self._state["stale_shards"] = sorted(shards)
            self._state["updated_at"] = self._clock()
            return self._write_if_due_locked(True)

    def carry_over(self, previous: dict[str, Any] | None) -> bool:
        """Take over what a previous process of this participant published (its heartbeat
        document, e.g. from :func:`read_heartbeat`): the cumulative fault counters and the last
        checkpoint's version vector. Counters never go back, values of the wrong type are
        ignored. A restart thus keeps "the same step failed again" visible to the policy engine.
        Writes the heartbeat at once when a value changed; returns whether it did."""
        if not previous:
            return False
        counts = {
            key: value
            for key in (*_CARRIED_COUNTERS, "train_last_failed_step")
            if isinstance(value := previous.get(key), int)
            and not isinstance(value, bool)
            and value >= 0
        }
        step, version = (
            previous.get("checkpoint_step"),
            previous.get("checkpoint_inference_version"),
        )
        with self._holding_lock():
            before = dict(self._state)
            failures = counts.get("train_step_failures_total", 0)
            if failures > self._state["train_step_failures_total"]:
                self._state["train_last_failed_step"] = counts.get("train_last_failed_step")
            for key in _CARRIED_COUNTERS:
                self._state[key] = max(self._state[key], counts.get(key, 0))
            if (
                self._state["checkpoint_step"] is None
                and isinstance(step, int)
                and isinstance(version, int)
                and not isinstance(step, bool)
                and step >= 0
                and version >= 0
            ):
                self._state["checkpoint_step"] = step
                self._state["checkpoint_inference_version"] = version
            budget = previous.get("first_step_budget_seconds")
            if self._state["first_step_budget_seconds"] is None and (
                isinstance(budget, int | float) and not isinstance(budget, bool) and budget > 0
            ):
                self._state["first_step_budget_seconds"] = float(budget)
            failed = previous.get("rollout_failed_samples_total")
            if isinstance(failed, int) and not isinstance(failed, bool) and failed > 0:
                self._state["rollout_failed_samples_total"] = max(
                    self._state["rollout_failed_samples_total"] or 0, failed
                )
            if self._state == before:
                return False
            self._state["updated_at"] = self._clock()
            return self._write_if_due_locked(True)

    def restore_fault_counts(
        self,
        *,
        step_failures: int,
        last_failed_step: int | None,
        rollout_timeouts: int,
    ) -> bool:
        """Set the fault counters to totals kept elsewhere (a resumed phase machine's state).

        Counters never go back: a total below the current one is ignored for that counter.
        Writes the heartbeat at once when a value changed.
        """
        failures = _check_count("step_failures", step_failures)
        timeouts = _check_count("rollout_timeouts", rollout_timeouts)
        last = _check_count("last_failed_step", last_failed_step)
        with self._holding_lock():
            before = dict(self._state)
            if failures is not None and failures > self._state["train_step_failures_total"]:
                self._state["train_step_failures_total"] = failures
                self._state["train_last_failed_step"] = last
            if timeouts is not None and timeouts > self._state["rollout_batch_timeouts_total"]:
                self._state["rollout_batch_timeouts_total"] = timeouts
            if self._state == before:
                return False
            return self._write_if_due_locked(True)

    def record_checkpoint(self, step: int, inference_version: int) -> bool:
        """Publish the version vector of the checkpoint that just committed; write at once.

        ``step`` is its training step and ``inference_version`` the weight version the rollouts
        had when it was taken. Commits are rare and an operator deciding on a restore needs the
        newest one, so the interval does not hold this back. A vector older than the one already
        published (a late duplicate) is ignored and returns False.
        """
        checked_step = _check_count("step", step)
        checked_version = _check_count("inference_version", inference_version)
        if checked_step is None or checked_version is None:
            raise HeartbeatError(
                f"step and inference_version must be ints >= 0, got {step!r}, {inference_version!r}"
            )
        with self._holding_lock():
            current = self._state["checkpoint_step"]
            if current is not None and (current, self._state["checkpoint_inference_version"]) > (
                checked_step,
                checked_version,
            ):
                return False
            self._state["checkpoint_step"] = checked_step
            self._state["checkpoint_inference_version"] = checked_version
            self._state["updated_at"] = self._clock()
            return self._write_if_due_locked(True)

    def _bump_fault(self, **changes: Any) -> bool:
        with self._holding_lock():
            for key, value in changes.items():
                if key.endswith("_total"):
                    self._state[key] += value
                else:
                    self._state[key] = value
            self._state["updated_at"] = self._clock()
            return self._write_if_due_locked(True)

    def set_first_step_budget(self, seconds: float | None) -> bool:
        """Declare how long this process's first step (after a start or a restart) may take
        before RLGuard judges it hung (``train_hang``), overriding the policy's
        ``first_step_budget_seconds``; None goes back to the policy's. Written at once."""
        if seconds is not None:
            checked = _check_finite(seconds)
            if checked is None or checked <= 0:
                raise HeartbeatError(
                    f"first-step budget must be a positive number of seconds, got {seconds!r}"
                )
            seconds = checked
        with self._holding_lock():
            self._state["first_step_budget_seconds"] = seconds
            return self._write_if_due_locked(True)

    def record_failed_samples(self, count: int = 1) -> bool:
        """Count ``count`` generations that failed or came back empty (an engine error, a
        timeout, an empty completion a framework would otherwise pass on as data); write if
        ``interval`` has passed. Cumulative; the policy engine compares its rise with the
        tokens generated meanwhile (a rising failure ratio is a fault before the data runs
        dry)."""
        checked = _check_count("count", count)
        with self._holding_lock():
            self._state["rollout_failed_samples_total"] = (
                self._state["rollout_failed_samples_total"] or 0
            ) + (checked or 0)
            self._state["updated_at"] = self._clock()
            return self._write_if_due_locked(False)

    def record_samples(self, count: int) -> bool:
        """Count ``count`` generations finished, failed or empty ones included (those also go to
        :meth:`record_failed_samples`): the failure ratio's denominator. Write if due."""
        checked = _check_count("count", count)
        with self._holding_lock():
            total = self._state["rollout_samples_total"] or 0
            self._state["rollout_samples_total"] = total + (checked or 0)
            self._state["updated_at"] = self._clock()
            return self._write_if_due_locked(False)

    def set_signals(self, values: dict[str, float]) -> bool:
        """Merge ``{name: value}`` into the published training signals; write if ``interval``
        has passed. Names follow :data:`SIGNAL_PATTERN`, values are finite numbers; anything
        else raises :class:`HeartbeatError` and changes nothing."""
        if not isinstance(values, dict):
            raise HeartbeatError(f"signals must be a dict of name -> number, got {values!r}")
        checked: dict[str, float] = {}
        for name, value in values.items():
            if not isinstance(name, str) or not SIGNAL_PATTERN.match(name):
                raise HeartbeatError(
                    f"signal name must match {SIGNAL_PATTERN.pattern}, got {name!r}"
                )
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise HeartbeatError(f"signal {name} must be a number, got {value!r}")
            if not (-float("inf") < float(value) < float("inf")):
                raise HeartbeatError(f"signal {name} must be finite, got {value!r}")
            checked[name] = float(value)
        with self._holding_lock():
            merged = {**self._state["signals"], **checked}
            if len(merged) > _MAX_SIGNALS:
                raise HeartbeatError(f"at most {_MAX_SIGNALS} signals, got {len(merged)}")
            self._state["signals"] = merged
            self._state["updated_at"] = self._clock()
            return self._write_if_due_locked(False)

    def record_state_log_latency(self, latency_ms: float) -> bool:
        """Record the latency of the last state-log append; write if ``interval`` has passed."""
        return self.update(state_log_latency_ms=latency_ms)

    def flush(self) -> None:
        """Write the heartbeat now, whatever the interval."""
        with self._holding_lock():
            self._write_if_due_locked(True)

    def snapshot(self) -> dict[str, Any]:
        """Return the heartbeat document as it would be written now (a copy)."""
        with self._holding_lock():
            return self._document_locked()

    def start_keepalive(self) -> None:
        """Rewrite the heartbeat every ``interval`` from a daemon thread until :meth:`close`."""
        if self._keepalive is not None:
            return
        self._stop.clear()
        thread = threading.Thread(
            target=self._keepalive_loop, name=f"heartbeat-{self._path.stem}", daemon=True
        )
        self._keepalive = thread
        thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the keepalive thread (waiting at most ``timeout`` seconds) and write a last time."""
        thread = self._keepalive
        self._stop.set()
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                raise RecoveryTimeout(f"heartbeat keepalive thread did not stop within {timeout}s")
            self._keepalive = None
        self.flush()

    def _keepalive_loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.flush()
            except (OSError, RecoveryError) as exc:
                # A full disk must not kill the training process; the agent sees the age grow.
                log.warning("heartbeat write to %s failed: %s", self._path, exc)

    def _document_locked(self) -> dict[str, Any]:
        now = self._clock()
        doc = dict(self._state)
        doc["shard_rebuilds"] = [t for t in self._rebuilds if now - t <= SHARD_REBUILD_WINDOW_S]
        doc["stale_shards"] = list(self._state["stale_shards"])
        doc["signals"] = dict(self._state["signals"])
        doc["ts"] = now
        return doc

    def _write_if_due_locked(self, force: bool) -> bool:
        now = self._clock()
        if not force and now - self._last_write < self._interval:
            return False
        _replace_heartbeat_file(self._path, self._document_locked())
        self._last_write = now
        return True


def _replace_heartbeat_file(path: Path, doc: dict[str, Any]) -> None:
    data = json.dumps(doc, separators=(",", ":")).encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Advisory and rewritten every interval: no fsync. The temporary name does not end in
        # ".json", the only files the agent reads.
        replace_file(path, data, sync=False)
    except OSError as exc:
        raise HeartbeatError(f"cannot write heartbeat {path}: {exc}") from exc


def read_heartbeat(path: Path) -> dict[str, Any] | None:
    """The heartbeat document at ``path``; None when it is missing or being replaced."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None
