"""The training loop's phase machine: INIT → PREPARE → ROLLOUT → COLLECT → TRAIN → EVAL → ROLLOUT…

Events drive it (``rollout_complete``, ``data_available``, ``train_step_done`` …); deadlines are
checked by :meth:`PhaseMachine.tick`:

* COLLECT waits at most ``rollout_timeout_sec`` for rollout data, then fires ``retry_rollout``;
  after ``rollout_retry_times`` retries of one step the job enters SAFE_MODE instead;
* a failed TRAIN step is recorded and skipped, unless it is the run's first step or a step that
  failed once already (SAFE_MODE);
* SAFE_MODE refuses every event that would start rollouts until ``release_safe_mode`` or a newer
  ``run`` in the job's control file (:mod:`recovery.control`, read on every ``fire``/``tick``).

Every transition is one state-log line (:mod:`recovery.statelog`) with the full state, so
:meth:`PhaseMachine.resume` restores it after a restart; an illegal event raises
:class:`IllegalTransitionError` and changes nothing. A :class:`recovery.report.HeartbeatReporter`
given to it gets failed train steps, rollout timeouts and failed state-log appends, as the run's
totals.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TypedDict, Unpack

from recovery.control import ControlMode, read_control
from recovery.errors import RecoveryError
from recovery.report import HeartbeatError, HeartbeatReporter
from recovery.statelog import StateLog, StateLogWriteError, StateRecord, last_state_record

__all__ = [
    "Event",
    "IllegalTransitionError",
    "Phase",
    "PhaseConfig",
    "PhaseError",
    "PhaseMachine",
    "SafeModeError",
]

logger = logging.getLogger("rlguard.recovery.phases")


class PhaseError(RecoveryError):
    """The phase machine refused a request or its configuration."""


class IllegalTransitionError(PhaseError):
    """An event that the current phase does not accept."""


class SafeModeError(IllegalTransitionError):
    """The job is in SAFE_MODE: no new rollouts until it is released."""


class Phase(StrEnum):
    """Where the training loop is."""

    INIT = "INIT"
    PREPARE = "PREPARE"
    ROLLOUT = "ROLLOUT"
    COLLECT = "COLLECT"
    TRAIN = "TRAIN"
    EVAL = "EVAL"
    SAFE_MODE = "SAFE_MODE"


class Event(StrEnum):
    """What happened."""

    START = "start"
    PREPARED = "prepared"
    ROLLOUT_COMPLETE = "rollout_complete"
    DATA_AVAILABLE = "data_available"
    RETRY_ROLLOUT = "retry_rollout"
    TRAIN_STEP_DONE = "train_step_done"
    TRAIN_STEP_FAILED = "train_step_failed"
    EVAL_DONE = "eval_done"
    ENTER_SAFE_MODE = "enter_safe_mode"
    RELEASE_SAFE_MODE = "release_safe_mode"


# The plain edges; RETRY_ROLLOUT, TRAIN_STEP_FAILED and the SAFE_MODE events have logic.
_EDGES: dict[tuple[Phase, Event], Phase] = {
    (Phase.INIT, Event.START): Phase.PREPARE,
    (Phase.PREPARE, Event.PREPARED): Phase.ROLLOUT,
    (Phase.ROLLOUT, Event.ROLLOUT_COMPLETE): Phase.COLLECT,
    (Phase.COLLECT, Event.DATA_AVAILABLE): Phase.TRAIN,
    (Phase.TRAIN, Event.TRAIN_STEP_DONE): Phase.EVAL,
    (Phase.EVAL, Event.EVAL_DONE): Phase.ROLLOUT,
}
_RETRYABLE = frozenset({Phase.ROLLOUT, Phase.COLLECT})
# Keys every state-log line of the machine carries; callers' extra info may not shadow them.
_RESERVED_PAYLOAD = frozenset(
    {
        "machine",
        "event",
        "previous",
        "step",
        "attempt",
        "failed_steps",
        "safe_mode_reason",
        "control_revision",
        "rollout_timeouts",
        "reason",
    }
)
# What a phase's deadline fires. COLLECT's comes from rollout_timeout_sec.
_ON_TIMEOUT = {
    Phase.PREPARE: Event.ENTER_SAFE_MODE,
    Phase.ROLLOUT: Event.RETRY_ROLLOUT,
    Phase.COLLECT: Event.RETRY_ROLLOUT,
    Phase.TRAIN: Event.TRAIN_STEP_FAILED,
    Phase.EVAL: Event.EVAL_DONE,
}


@dataclass(frozen=True)
class PhaseConfig:
    """Timeouts and retry budgets (defaults from the fault-tolerance configuration)."""

    rollout_timeout_sec: float = 120.0
    rollout_retry_times: int = 3
    #: Extra deadlines, in seconds, for PREPARE, ROLLOUT, TRAIN or EVAL (none by default).
    phase_timeouts: Mapping[Phase, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _positive(self.rollout_timeout_sec):
            raise PhaseError(f"rollout_timeout_sec must be > 0, got {self.rollout_timeout_sec!r}")
        retries = self.rollout_retry_times
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise PhaseError(f"rollout_retry_times must be an int >= 0, got {retries!r}")
        for phase, seconds in self.phase_timeouts.items():
            if phase not in _ON_TIMEOUT or phase is Phase.COLLECT:
                raise PhaseError(
                    f"phase_timeouts: {phase!r} cannot have a timeout here "
                    "(use rollout_timeout_sec for COLLECT)"
                )
            if not _positive(seconds):
                raise PhaseError(f"phase_timeouts[{phase}] must be > 0, got {seconds!r}")

    def timeout_for(self, phase: Phase) -> float | None:
        """Seconds the phase may last, or None."""
        if phase is Phase.COLLECT:
            return self.rollout_timeout_sec
        return self.phase_timeouts.get(phase)


def _positive(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


@dataclass
class _State:
    phase: Phase = Phase.INIT
    step: int = 0
    attempt: int = 0
    failed_steps: list[int] = field(default_factory=list)
    safe_mode_reason: str | None = None
    control_revision: int = 0
    rollout_timeouts: int = 0


class MachineOptions(TypedDict, total=False):
    """The constructor's keyword options besides ``name``, which :meth:`PhaseMachine.resume`
    passes through as they are (written once here rather than in both signatures)."""

    run_dir: str | os.PathLike[str] | None
    config: PhaseConfig | None
    clock: Callable[[], float]
    first_step: int
    reporter: HeartbeatReporter | None


class PhaseMachine:
    """The phase machine of one training process, logging to ``state_log``.

    ``name`` tells this machine's lines apart when several processes share one state log;
    ``run_dir`` is where the control file lives (None: no control file is consulted);
    ``clock`` is a monotonic clock in seconds for the phase deadlines; ``first_step`` is the
    run's first training step (a failure there is a heavy fault); ``reporter`` (optional) is
    the process's heartbeat reporter, told about failed steps, rollout timeouts and failed
    state-log appends.
    """

    def __init__(
        self,
        state_log: StateLog,
        *,
        name: str = "trainer",
        run_dir: str | os.PathLike[str] | None = None,
        config: PhaseConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        first_step: int = 0,
        reporter: HeartbeatReporter | None = None,
    ) -> None:
        if reporter is not None and not isinstance(reporter, HeartbeatReporter):
            raise PhaseError(f"reporter must be a HeartbeatReporter or None, got {reporter!r}")
        if not isinstance(name, str) or not name.strip():
            raise PhaseError(f"name must be a non-empty string, got {name!r}")
        if isinstance(first_step, bool) or not isinstance(first_step, int) or first_step < 0:
            raise PhaseError(f"first_step must be an int >= 0, got {first_step!r}")
        self.state_log = state_log
        self.name = name
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.config = config if config is not None else PhaseConfig()
        self.first_step = first_step
        self.reporter = reporter
        self._clock = clock
        self._state = _State(step=first_step)
        self._entered_at = clock()

    @classmethod
    def resume(
        cls, state_log: StateLog, *, name: str = "trainer", **options: Unpack[MachineOptions]
    ) -> PhaseMachine:
        """A machine in the state its last logged transition recorded (INIT if none); the
        options are the constructor's.

        The phase's deadline restarts now: a monotonic clock does not survive a restart.
        A ``resume`` line is logged so the restart is visible in the state log.
        """
        machine = cls(state_log, name=name, **options)
        last = last_state_record(state_log.path, match=lambda r: r.payload.get("machine") == name)
        if last is None:
            return machine
        machine._state = _state_from(last)
        machine._report_totals()
        machine._log("resume", machine._state.phase, reason=None)
        logger.info("phase machine %s resumed in %s at step %d", name, machine.phase, machine.step)
        return machine

    # ------------------------------------------------------------------ read-only view

    @property
    def phase(self) -> Phase:
        """The current phase."""
        return self._state.phase

    @property
    def step(self) -> int:
        """The training step the loop is working on."""
        return self._state.step

    @property
    def rollout_attempt(self) -> int:
        """How many times this step's rollout was retried."""
        return self._state.attempt

    @property
    def failed_steps(self) -> tuple[int, ...]:
        """Steps whose training failed and were skipped."""
        return tuple(self._state.failed_steps)

    @property
    def rollout_timeouts(self) -> int:
        """How many rollouts timed out over the run (survives :meth:`resume`)."""
        return self._state.rollout_timeouts

    @property
    def safe_mode_reason(self) -> str | None:
        """Why the job is in SAFE_MODE (None outside it)."""
        return self._state.safe_mode_reason

    def can_start_rollout(self) -> bool:
        """True unless SAFE_MODE (here or commanded by the control file) forbids it."""
        self._obey_control()
        return self._state.phase is not Phase.SAFE_MODE

    def deadline_in(self) -> float | None:
        """Seconds until the current phase times out, or None if it has no deadline."""
        timeout = self.config.timeout_for(self._state.phase)
        if timeout is None:
            return None
        return self._entered_at + timeout - self._clock()

    # ------------------------------------------------------------------ driving

    def fire(self, event: Event | str, *, reason: str | None = None, **info: Any) -> Phase:
        """Apply ``event`` and return the new phase; raise if the current phase refuses it.

        ``reason`` explains failures and SAFE_MODE; ``info`` (JSON values) is logged with the
        transition. The control file is obeyed first, so a commanded SAFE_MODE refuses the
        event with :class:`SafeModeError`.
        """
        parsed = _parse_event(event)
        if reason is not None and not isinstance(reason, str):
            raise PhaseError(f"reason must be a string, got {type(reason).__name__}")
        clashing = sorted(_RESERVED_PAYLOAD & info.keys())
        if clashing:
            raise PhaseError(f"info keys {clashing} are reserved for the machine's own state")
        self._obey_control()
        return self._apply(parsed, reason, info)

    def tick(self) -> Phase:
        """Obey the control file and fire the current phase's timeout if it has expired."""
        self._obey_control()
        remaining = self.deadline_in()
        if remaining is not None and remaining <= 0:
            phase = self._state.phase
            timeout = self.config.timeout_for(phase)
            reason = f"{phase} timed out after {timeout:g}s"
            logger.warning("phase machine %s: %s", self.name, reason)
            return self._apply(_ON_TIMEOUT[phase], reason, {"timeout": True})
        return self._state.phase

    def _apply(self, event: Event, reason: str | None, info: Mapping[str, Any]) -> Phase:
        state = self._state
        phase = state.phase
        if phase is Phase.SAFE_MODE and event is not Event.RELEASE_SAFE_MODE:
            raise SafeModeError(
                f"{event} refused: the job is in SAFE_MODE ({state.safe_mode_reason}); "
                "no new rollouts until it is released"
            )
        new = _State(**{**state.__dict__, "failed_steps": list(state.failed_steps)})
        if (phase, event) in _EDGES:
            target = _EDGES[(phase, event)]
            if event is Event.EVAL_DONE:
                new.step, new.attempt = state.step + 1, 0
            elif event is Event.PREPARED:
                new.attempt = 0
        elif event is Event.RETRY_ROLLOUT and phase in _RETRYABLE:
            if info.get("timeout") is True:
                new.rollout_timeouts += 1
            if state.attempt >= self.config.rollout_retry_times:
                target = Phase.SAFE_MODE
                reason = (
                    f"rollout of step {state.step} failed after "
                    f"{self.config.rollout_retry_times} retries"
                    + (f" (last: {reason})" if reason else "")
                )
                new.safe_mode_reason = reason
            else:
                target, new.attempt = Phase.ROLLOUT, state.attempt + 1
        elif event is Event.TRAIN_STEP_FAILED and phase is Phase.TRAIN:
            target = self._after_train_failure(new, reason)
        elif event is Event.ENTER_SAFE_MODE:
            if not reason:
                raise PhaseError("enter_safe_mode needs a reason")
            target, new.safe_mode_reason = Phase.SAFE_MODE, reason
        elif event is Event.RELEASE_SAFE_MODE and phase is Phase.SAFE_MODE:
            target, new.safe_mode_reason, new.attempt = Phase.PREPARE, None, 0
        else:
            raise IllegalTransitionError(f"event {event} is not allowed in phase {phase}")
        new.phase = target
        self._log(event, target, reason=reason, info=info, new=new, old_phase=phase)
        self._state = new
        self._entered_at = self._clock()
        if event is Event.TRAIN_STEP_FAILED:
            self._report(lambda r: r.record_step_failure(new.failed_steps[-1]))
        if new.rollout_timeouts > state.rollout_timeouts:
            self._report(lambda r: r.record_rollout_timeout())
        if target is Phase.SAFE_MODE:
            logger.error("phase machine %s entered SAFE_MODE: %s", self.name, reason)
        return target

    def _after_train_failure(self, new: _State, reason: str | None) -> Phase:
        step = new.step
        repeated = step in new.failed_steps
        new.failed_steps.append(step)
        if step == self.first_step or repeated:
            why = "first step" if step == self.first_step else "same step failed again"
            new.safe_mode_reason = (
                f"training step {step} failed ({why}): {reason or 'no reason given'}"
            )
            return Phase.SAFE_MODE
        # A light fault: record the step, skip it, carry on with the next one.
        new.step, new.attempt = step + 1, 0
        return Phase.ROLLOUT

    def _obey_control(self) -> None:
        if self.run_dir is None:
            return
        control = read_control(self.run_dir)
        if control.revision <= self._state.control_revision:
            return
        phase = self._state.phase
        if control.mode is ControlMode.SAFE_MODE and phase is not Phase.SAFE_MODE:
            self._state.control_revision = control.revision
            self._apply(Event.ENTER_SAFE_MODE, control.reason, {"source": "control_file"})
        elif control.mode is ControlMode.RUN and phase is Phase.SAFE_MODE:
            self._state.control_revision = control.revision
            self._apply(Event.RELEASE_SAFE_MODE, control.reason, {"source": "control_file"})
        else:
            # Nothing to do (already in the commanded mode); remember that we saw it.
            self._state.control_revision = control.revision

    def _log(
        self,
        event: Event | str,
        target: Phase,
        *,
        reason: str | None,
        info: Mapping[str, Any] | None = None,
        new: _State | None = None,
        old_phase: Phase | None = None,
    ) -> StateRecord:
        state = new if new is not None else self._state
        payload: dict[str, Any] = dict(info or {})
        payload.update(
            machine=self.name,
            event=str(event),
            previous=str(old_phase if old_phase is not None else state.phase),
            step=state.step,
            attempt=state.attempt,
            failed_steps=list(state.failed_steps),
            safe_mode_reason=state.safe_mode_reason,
            control_revision=state.control_revision,
            rollout_timeouts=state.rollout_timeouts,
        )
        if reason is not None:
            payload["reason"] = reason
        try:
            return self.state_log.append(target.value, payload)
        except StateLogWriteError:
            # Storage trouble: the agent must hear of it even though the log cannot say so.
            self._report(lambda r: r.record_state_log_error())
            raise

    def _report(self, call: Callable[[HeartbeatReporter], object]) -> None:
        if self.reporter is None:
            return
        try:
            call(self.reporter)
        except HeartbeatError as exc:
            # A heartbeat that cannot be written must not stop training; the agent sees its
            # age grow instead.
            logger.warning("phase machine %s: heartbeat report failed: %s", self.name, exc)

    def _report_totals(self) -> None:
        state = self._state
        self._report(
            lambda r: r.restore_fault_counts(
                step_failures=len(state.failed_steps),
                last_failed_step=state.failed_steps[-1] if state.failed_steps else None,
                rollout_timeouts=state.rollout_timeouts,
            )
        )


def _parse_event(event: object) -> Event:
    if isinstance(event, str):
        try:
            return Event(event)
        except ValueError:
            pass
    allowed = ", ".join(e.value for e in Event)
    raise PhaseError(f"unknown event {event!r}; expected one of {allowed}")


def _state_from(record: StateRecord) -> _State:
    payload = record.payload
    try:
        return _State(
            phase=Phase(record.state),
            step=int(payload["step"]),
            attempt=int(payload["attempt"]),
            failed_steps=[int(s) for s in payload["failed_steps"]],
            safe_mode_reason=payload.get("safe_mode_reason"),
            control_revision=int(payload.get("control_revision", 0)),
            rollout_timeouts=int(payload.get("rollout_timeouts", 0)),
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise PhaseError(f"cannot resume from state-log line {record!r}: {exc}") from exc
