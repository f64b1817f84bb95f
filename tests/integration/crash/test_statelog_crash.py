"""kill -9 processes appending to the state log and driving the phase machine."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from recovery.phases import Event, Phase, PhaseMachine
from recovery.statelog import StateLog, last_state_record, read_state_log

from ._harness import Reporter, assert_killed, run_and_kill

pytestmark = pytest.mark.timeout(150)


def _appender(path: Path, seed: int) -> Callable[[Reporter], None]:
    def child(report: Reporter) -> None:
        rng = random.Random(seed)
        log = StateLog(path)
        last = last_state_record(path)
        n = 0 if last is None else last.payload["n"] + 1
        while True:
            report.begin(str(n))
            log.append("ROLLOUT", {"n": n, "pad": "p" * rng.randrange(0, 6000)})
            report.ack(str(n))
            n += 1

    return child


def test_state_log_writer_killed_60_times(tmp_path: Path) -> None:
    path = tmp_path / "state_log.jsonl"
    rng = random.Random(3)
    present = 0  # lines in the log before the run
    total_acked = 0
    for kill in range(60):
        run = run_and_kill(
            _appender(path, kill),
            kill_after=rng.uniform(0.003, 0.05),
            from_first_report=kill % 10 != 0,  # every 10th kill may land during start-up
        )
        assert_killed(run)
        total_acked += len(run.acked)
        last_acked = int(run.acked[-1]) if run.acked else present - 1
        numbers = [r.payload["n"] for r in read_state_log(path)]
        assert numbers == list(range(len(numbers))), "lines lost, repeated or reordered"
        allowed = {last_acked + 1}
        if run.in_flight is not None:
            allowed.add(last_acked + 2)
        assert len(numbers) in allowed, (len(numbers), last_acked, run.in_flight)
        present = len(numbers)
    assert total_acked > 60, f"too few appends before the kills: {total_acked}"


def _driver(path: Path, seed: int) -> Callable[[Reporter], None]:
    """Resume the machine and drive it through cycles, with failures and retries."""

    def child(report: Reporter) -> None:
        rng = random.Random(seed)
        log = StateLog(path)
        report.begin("resume")
        machine = PhaseMachine.resume(log, first_step=0)
        report.ack(f"resume {machine.phase} {machine.step} {machine.rollout_attempt}")
        while True:
            phase = machine.phase
            if phase is Phase.COLLECT:
                event = Event.RETRY_ROLLOUT if rng.random() < 0.2 else Event.DATA_AVAILABLE
            elif phase is Phase.TRAIN:
                event = Event.TRAIN_STEP_FAILED if rng.random() < 0.15 else Event.TRAIN_STEP_DONE
            else:
                event = {
                    Phase.INIT: Event.START,
                    Phase.PREPARE: Event.PREPARED,
                    Phase.ROLLOUT: Event.ROLLOUT_COMPLETE,
                    Phase.EVAL: Event.EVAL_DONE,
                    Phase.SAFE_MODE: Event.RELEASE_SAFE_MODE,
                }[phase]
            report.begin(event.value)
            machine.fire(event, reason="injected" if "fail" in event.value else None)
            report.ack(f"{event.value} {machine.phase} {machine.step} {machine.rollout_attempt}")

    return child


def test_phase_machine_killed_40_times_resumes_where_it_was(tmp_path: Path) -> None:
    path = tmp_path / "state_log.jsonl"
    rng = random.Random(11)
    acked_state: tuple[str, int, int] | None = None
    steps_seen = 0
    for kill in range(40):
        run = run_and_kill(
            _driver(path, kill),
            kill_after=rng.uniform(0.01, 0.06),
            from_first_report=kill % 10 != 0,
        )
        assert_killed(run)
        if run.acked:
            _, phase, step, attempt = run.acked[-1].split(" ")
            acked_state = (phase, int(step), int(attempt))
            steps_seen = max(steps_seen, int(step))
        read_state_log(path)  # the whole log stays readable
        last = last_state_record(path, match=lambda r: r.payload.get("machine") == "trainer")
        if acked_state is None:
            continue
        assert last is not None
        found = (last.state, last.payload["step"], last.payload["attempt"])
        if found != acked_state:
            assert run.in_flight is not None and last.payload["event"] == run.in_flight, (
                f"state log says {found}, last acknowledged {acked_state}, in flight {run.in_flight}"
            )
        with StateLog(path) as log:
            resumed = PhaseMachine.resume(log)
            assert (resumed.phase.value, resumed.step, resumed.rollout_attempt) == found
        acked_state = found  # an in-flight event that landed is what the next run starts from
    assert steps_seen > 20, f"the machine barely moved: {steps_seen} steps"
