"""Hang forensics on the reference GRPO job (``workload``, under its own supervisor as the
launcher hook, watched by the embedded ``rlguard up`` and a node agent): its trainer spinning
in a "collective" (chaos ``spin``: CPU busy, heartbeat fresh, step frozen) is judged
``train_hang``; then the restarted trainer, SIGSTOPped (chaos ``hang``), is judged
``heartbeat_lost``. Each time the worker's ``restart_role`` first has the supervisor dump the
process's Python stacks with py-spy; the stacks name where the trainer was, are on the incident
before the restart, and the spinning one shows on the incident page in real Chromium."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import free_port, wait_for
from tests.integration.forensics._common import HangStack, shown_in_chromium, stacks_of
from workload.chaos import Fault, inject
from workload.job import RunDir, read_events, read_json

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(360)]
JOB = "ref-hang"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[HangStack]:
    s = HangStack(tmp_path, free_port(), job=JOB, steps=400, decode_ms=10.0, schedule=None)
    try:
        s.start_server()
        s.start_agent()
        s.start_job()
        yield s
    finally:
        s.stop()


def _trainer_pid(run: RunDir) -> int | None:
    pid = (read_json(run.root / "pids.json") or {}).get("trainer-0")
    return pid if isinstance(pid, int) else None


def _step(run: RunDir) -> int:
    return max((e["step"] for e in read_events(run) if e["kind"] == "step"), default=-1)


def _captured_then_restarted(stack: HangStack, run: RunDir, pid: int, logs: Any) -> dict[str, Any]:
    """The incident whose restart_role captured ``pid``'s stacks, once that restart succeeded
    and a new trainer trains; the capture came before the restart's result."""
    inc, entry = wait_for(
        lambda: stacks_of(stack, JOB, pid), 120, f"the stacks of trainer {pid}", context=logs
    )
    d = entry["detail"]
    assert d["ok"] is True, d
    assert f"Thread {pid}" in d["text"] and "workload/trainer.py" in d["text"], d["text"]

    def restarted() -> dict[str, Any] | None:
        acts = [a for a in stack.incident(inc["id"])["actions"] if a["action"] == "restart_role"]
        return acts[0] if acts and acts[0]["status"] in ("succeeded", "failed") else None

    act = wait_for(restarted, 90, "restart_role to finish", context=logs)
    assert act["status"] == "succeeded", act
    kinds = [e["type"] for e in stack.incident(inc["id"])["timeline"]]
    assert kinds.index("stacks_captured") < kinds.index("action_succeeded"), kinds
    wait_for(lambda: _trainer_pid(run) not in (None, pid), 60, "a new trainer", context=logs)
    step = _step(run)
    wait_for(lambda: _step(run) >= step + 2, 120, "training to go on", context=logs)
    return stack.incident(inc["id"])


def test_stacks_of_the_reference_trainer_spinning_then_stopped(
    stack: HangStack, browser: object
) -> None:
    run = RunDir(stack.run_dir)

    def logs() -> str:
        out = [
            f"--- {f.name}\n{f.read_text(errors='replace')[-1500:]}"
            for f in sorted((stack.workdir / "logs").glob("*.log"))
        ]
        out += [
            f"--- run {f.name}\n{f.read_text(errors='replace')[-1500:]}"
            for f in sorted((run.root / "logs").glob("*.log"))
        ]
        out.append(f"--- incidents {[(i['kind'], i['status']) for i in stack.incidents()]}")
        return "\n".join(out)

    # Past the first steps (a fault there is a first-step anomaly, heavy) and long enough for
    # the hang detector to know the trainer's pace (hang_min_steps + 1 steps seen).
    wait_for(lambda: _step(run) >= 8, 180, "step 8", context=logs)
    spinning = _trainer_pid(run)
    assert spinning is not None
    inject(run, Fault("spin"))
    spun = _captured_then_restarted(stack, run, spinning, logs)
    assert spun["kind"] == "train_hang", spun
    [entry] = [e for e in spun["timeline"] if e["type"] == "stacks_captured"]
    assert "_spin_in_collective" in entry["detail"]["text"]  # where it spun
    assert "_train" in entry["detail"]["text"]  # called from the train step

    stopped = _trainer_pid(run)
    assert stopped is not None and stopped != spinning
    inject(run, Fault("hang", role="trainer"))  # SIGSTOP: frozen whole, heartbeat included
    frozen = _captured_then_restarted(stack, run, stopped, logs)
    assert frozen["kind"] == "heartbeat_lost", frozen
    [entry] = [
        e
        for e in frozen["timeline"]
        if e["type"] == "stacks_captured" and e["detail"]["pid"] == stopped
    ]
    assert entry["detail"]["nonblocking"] is True  # read without pausing it again

    shown_in_chromium(stack, browser, spun["id"], "_spin_in_collective")
