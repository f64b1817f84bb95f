"""The phase machine: transitions, timeouts and retries, SAFE_MODE, control file, resume."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from recovery.control import write_control
from recovery.errors import RecoveryError
from recovery.phases import (
    Event,
    IllegalTransitionError,
    Phase,
    PhaseConfig,
    PhaseError,
    PhaseMachine,
    SafeModeError,
)
from recovery.statelog import StateLog, read_state_log

pytestmark = pytest.mark.timeout(60)


class FakeClock:
    """A monotonic clock the test moves by hand (phase deadlines are minutes long)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def log(tmp_path: Path) -> Iterator[StateLog]:
    state_log = StateLog(tmp_path / "state_log.jsonl", sync=False)
    yield state_log
    state_log.close()


def _to_collect(machine: PhaseMachine) -> None:
    if machine.phase is Phase.INIT:
        machine.fire(Event.START)
        machine.fire(Event.PREPARED)
    machine.fire(Event.ROLLOUT_COMPLETE)


def test_full_cycle_and_state_log_lines(log: StateLog, clock: FakeClock) -> None:
    machine = PhaseMachine(log, clock=clock)
    assert machine.phase is Phase.INIT
    path = [
        machine.fire("start"),
        machine.fire(Event.PREPARED),
        machine.fire(Event.ROLLOUT_COMPLETE),
        machine.fire(Event.DATA_AVAILABLE),
        machine.fire(Event.TRAIN_STEP_DONE, loss=0.5),
        machine.fire(Event.EVAL_DONE),
        machine.fire(Event.ROLLOUT_COMPLETE),
    ]
    assert path == [
        Phase.PREPARE,
        Phase.ROLLOUT,
        Phase.COLLECT,
        Phase.TRAIN,
        Phase.EVAL,
        Phase.ROLLOUT,
        Phase.COLLECT,
    ]
    assert machine.step == 1
    records = read_state_log(log.path)
    assert [r.state for r in records] == [p.value for p in path]
    eval_line = records[4]
    assert eval_line.payload["event"] == "train_step_done" and eval_line.payload["loss"] == 0.5
    assert eval_line.payload["previous"] == "TRAIN" and eval_line.payload["machine"] == "trainer"
    assert records[5].payload["step"] == 1


@pytest.mark.parametrize(
    ("setup", "event"),
    [
        ([], Event.ROLLOUT_COMPLETE),
        ([Event.START], Event.DATA_AVAILABLE),
        ([Event.START, Event.PREPARED], Event.TRAIN_STEP_DONE),
        ([Event.START, Event.PREPARED], Event.EVAL_DONE),
        ([Event.START], Event.RELEASE_SAFE_MODE),
        ([Event.START], Event.TRAIN_STEP_FAILED),
        ([Event.START], Event.RETRY_ROLLOUT),
    ],
)
def test_illegal_transitions_raise_and_write_nothing(
    log: StateLog, clock: FakeClock, setup: list[Event], event: Event
) -> None:
    machine = PhaseMachine(log, clock=clock)
    for e in setup:
        machine.fire(e)
    phase, lines = machine.phase, len(read_state_log(log.path))
    with pytest.raises(
        IllegalTransitionError, match=f"event {event.value} is not allowed in phase {phase.value}"
    ):
        machine.fire(event)
    assert machine.phase is phase
    assert len(read_state_log(log.path)) == lines


def test_bad_input(log: StateLog, clock: FakeClock) -> None:
    machine = PhaseMachine(log, clock=clock)
    with pytest.raises(PhaseError, match="unknown event 'explode'") as info:
        machine.fire("explode")
    assert isinstance(info.value, RecoveryError)
    with pytest.raises(PhaseError, match="reason must be a string"):
        machine.fire(Event.START, reason=3)  # type: ignore[arg-type]
    with pytest.raises(PhaseError, match="needs a reason"):
        machine.fire(Event.ENTER_SAFE_MODE)
    with pytest.raises(RecoveryError, match="not JSON-serializable"):
        machine.fire(Event.START, blob=object())
    with pytest.raises(PhaseError, match=r"info keys \['step'\] are reserved"):
        machine.fire(Event.START, step=99)
    assert machine.phase is Phase.INIT and read_state_log(log.path) == []
    with pytest.raises(PhaseError, match="name must be"):
        PhaseMachine(log, name="")
    with pytest.raises(PhaseError, match="first_step"):
        PhaseMachine(log, first_step=-1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rollout_timeout_sec": 0}, "rollout_timeout_sec must be > 0, got 0"),
        ({"rollout_timeout_sec": float("nan")}, "rollout_timeout_sec"),
        ({"rollout_retry_times": -1}, "rollout_retry_times must be an int >= 0, got -1"),
        ({"rollout_retry_times": 2.5}, "rollout_retry_times"),
        ({"phase_timeouts": {Phase.COLLECT: 5}}, "use rollout_timeout_sec"),
        ({"phase_timeouts": {Phase.SAFE_MODE: 5}}, "cannot have a timeout"),
        ({"phase_timeouts": {Phase.TRAIN: -5}}, "must be > 0, got -5"),
    ],
)
def test_bad_config(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(PhaseError, match=message):
        PhaseConfig(**kwargs)  # type: ignore[arg-type]


def test_collect_timeout_retries_rollout_three_times_then_safe_mode(
    log: StateLog, clock: FakeClock
) -> None:
    machine = PhaseMachine(log, clock=clock)
    _to_collect(machine)
    assert machine.deadline_in() == 120.0
    clock.advance(119.9)
    assert machine.tick() is Phase.COLLECT
    for attempt in (1, 2, 3):
        clock.advance(0.2 if attempt == 1 else 120.0)
        assert machine.tick() is Phase.ROLLOUT
        assert machine.rollout_attempt == attempt
        assert machine.deadline_in() is None  # ROLLOUT has no deadline by default
        machine.fire(Event.ROLLOUT_COMPLETE)
    clock.advance(121)
    assert machine.tick() is Phase.SAFE_MODE
    assert "failed after 3 retries" in (machine.safe_mode_reason or "")
    retries = [r for r in read_state_log(log.path) if r.payload["event"] == "retry_rollout"]
    assert [r.state for r in retries] == ["ROLLOUT"] * 3 + ["SAFE_MODE"]
    assert all(r.payload.get("timeout") is True for r in retries)
    assert "COLLECT timed out after 120s" in retries[0].payload["reason"]


def test_data_resets_the_retry_budget_for_the_next_step(log: StateLog, clock: FakeClock) -> None:
    machine = PhaseMachine(log, clock=clock, config=PhaseConfig(rollout_retry_times=1))
    _to_collect(machine)
    machine.fire(Event.RETRY_ROLLOUT, reason="batch_142 lost")
    machine.fire(Event.ROLLOUT_COMPLETE)
    for event in (Event.DATA_AVAILABLE, Event.TRAIN_STEP_DONE, Event.EVAL_DONE):
        machine.fire(event)
    assert machine.rollout_attempt == 0 and machine.step == 1
    machine.fire(Event.RETRY_ROLLOUT)  # allowed from ROLLOUT too
    assert machine.phase is Phase.ROLLOUT and machine.rollout_attempt == 1


def test_train_failure_is_recorded_and_skipped(log: StateLog, clock: FakeClock) -> None:
    machine = PhaseMachine(log, clock=clock)
    _to_collect(machine)
    for event in (Event.DATA_AVAILABLE, Event.TRAIN_STEP_DONE, Event.EVAL_DONE):
        machine.fire(event)
    machine.fire(Event.ROLLOUT_COMPLETE)
    machine.fire(Event.DATA_AVAILABLE)
    assert machine.fire(Event.TRAIN_STEP_FAILED, reason="CUDA out of memory") is Phase.ROLLOUT
    assert machine.failed_steps == (1,) and machine.step == 2
    last = read_state_log(log.path)[-1]
    assert last.payload["failed_steps"] == [1] and last.payload["reason"] == "CUDA out of memory"


def test_first_step_failure_is_a_heavy_fault(log: StateLog, clock: FakeClock) -> None:
    machine = PhaseMachine(log, clock=clock, first_step=0)
    _to_collect(machine)
    machine.fire(Event.DATA_AVAILABLE)
    assert machine.fire(Event.TRAIN_STEP_FAILED, reason="nan loss") is Phase.SAFE_MODE
    assert "first step" in (machine.safe_mode_reason or "")


def test_train_timeout_counts_as_a_failed_step(log: StateLog, clock: FakeClock) -> None:
    config = PhaseConfig(phase_timeouts={Phase.TRAIN: 300})
    machine = PhaseMachine(log, clock=clock, config=config, first_step=0)
    _to_collect(machine)
    for event in (Event.DATA_AVAILABLE, Event.TRAIN_STEP_DONE, Event.EVAL_DONE):
        machine.fire(event)
    machine.fire(Event.ROLLOUT_COMPLETE)
    machine.fire(Event.DATA_AVAILABLE)
    clock.advance(301)
    assert machine.tick() is Phase.ROLLOUT
    assert machine.failed_steps == (1,)


def test_safe_mode_refuses_rollouts_until_released(log: StateLog, clock: FakeClock) -> None:
    machine = PhaseMachine(log, clock=clock)
    machine.fire(Event.START)
    machine.fire(Event.PREPARED)
    machine.fire(Event.ENTER_SAFE_MODE, reason="two nodes lost")
    assert not machine.can_start_rollout()
    for event in (
        Event.ROLLOUT_COMPLETE,
        Event.PREPARED,
        Event.RETRY_ROLLOUT,
        Event.ENTER_SAFE_MODE,
    ):
        with pytest.raises(SafeModeError, match="two nodes lost"):
            machine.fire(event, reason="x")
    clock.advance(10_000)
    assert machine.tick() is Phase.SAFE_MODE  # no deadline in SAFE_MODE
    assert machine.fire(Event.RELEASE_SAFE_MODE, reason="approved by alice") is Phase.PREPARE
    assert machine.safe_mode_reason is None and machine.can_start_rollout()
    assert machine.fire(Event.PREPARED) is Phase.ROLLOUT


def test_control_file_commands_safe_mode_and_release(
    tmp_path: Path, log: StateLog, clock: FakeClock
) -> None:
    machine = PhaseMachine(log, clock=clock, run_dir=tmp_path)
    machine.fire(Event.START)
    machine.fire(Event.PREPARED)
    write_control(tmp_path, "safe_mode", "storage not writable")
    with pytest.raises(SafeModeError, match="storage not writable"):
        machine.fire(Event.ROLLOUT_COMPLETE)
    assert machine.phase is Phase.SAFE_MODE
    assert machine.tick() is Phase.SAFE_MODE  # the same revision is not applied twice
    write_control(tmp_path, "run", "approved: restore from step 40")
    assert machine.tick() is Phase.PREPARE
    machine.fire(Event.PREPARED)
    assert machine.phase is Phase.ROLLOUT
    events = [(r.state, r.payload["event"]) for r in read_state_log(log.path)]
    assert ("SAFE_MODE", "enter_safe_mode") in events and ("PREPARE", "release_safe_mode") in events
    assert read_state_log(log.path)[-1].payload["control_revision"] == 2


def test_internal_safe_mode_is_not_released_by_an_old_run_command(
    tmp_path: Path, log: StateLog, clock: FakeClock
) -> None:
    write_control(tmp_path, "run", "initial")
    machine = PhaseMachine(log, clock=clock, run_dir=tmp_path)
    machine.fire(Event.START)
    machine.fire(Event.ENTER_SAFE_MODE, reason="first-step anomaly")
    assert machine.tick() is Phase.SAFE_MODE
    assert not machine.can_start_rollout()


def test_resume_restores_the_last_transition(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "state_log.jsonl"
    with StateLog(path) as log:
        machine = PhaseMachine(log, clock=clock)
        _to_collect(machine)
        for event in (Event.DATA_AVAILABLE, Event.TRAIN_STEP_DONE, Event.EVAL_DONE):
            machine.fire(event)
        machine.fire(Event.ROLLOUT_COMPLETE)
        machine.fire(Event.DATA_AVAILABLE)
        machine.fire(Event.TRAIN_STEP_FAILED, reason="oom")
        machine.fire(Event.RETRY_ROLLOUT)
        # another process's machine shares the log
        other = PhaseMachine(log, name="rollout-0", clock=clock)
        other.fire(Event.START)
    with StateLog(path) as log:
        resumed = PhaseMachine.resume(log, clock=clock)
        assert (resumed.phase, resumed.step, resumed.rollout_attempt) == (Phase.ROLLOUT, 2, 1)
        assert resumed.failed_steps == (1,)
        assert resumed.deadline_in() is None
        assert read_state_log(path)[-1].payload["event"] == "resume"
        resumed.fire(Event.ROLLOUT_COMPLETE)
        assert resumed.deadline_in() == 120.0
        fresh = PhaseMachine.resume(log, name="never-ran", clock=clock)
        assert fresh.phase is Phase.INIT
        other_resumed = PhaseMachine.resume(log, name="rollout-0", clock=clock)
        assert other_resumed.phase is Phase.PREPARE


def test_resume_in_safe_mode_still_refuses(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "state_log.jsonl"
    with StateLog(path) as log:
        machine = PhaseMachine(log, clock=clock)
        machine.fire(Event.START)
        machine.fire(Event.ENTER_SAFE_MODE, reason="several nodes lost")
    with StateLog(path) as log:
        resumed = PhaseMachine.resume(log, clock=clock)
        assert resumed.phase is Phase.SAFE_MODE
        with pytest.raises(SafeModeError, match="several nodes lost"):
            resumed.fire(Event.PREPARED)


def test_resume_from_a_damaged_line_is_refused(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "state_log.jsonl"
    with StateLog(path) as log:
        log.append("TRAIN", {"machine": "trainer", "step": "many"})
        with pytest.raises(PhaseError, match="cannot resume"):
            PhaseMachine.resume(log, clock=clock)
