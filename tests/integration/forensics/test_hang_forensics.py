"""Hang forensics through the whole product: a training process under ``rlguard launch`` that
hangs (busy-looping, then SIGSTOPped) is judged hung or lost by the policy engine, the real
Celery worker (embedded ``rlguard up``) runs ``restart_role``, whose first step asks the
launcher for the process's Python stacks (``py-spy dump``); the stacks are on the incident
before the restart, name the function the process hung in, and show on the incident page in
real Chromium."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from app.cli.demo import DemoStack
from recovery.report import heartbeat_path, read_heartbeat
from recovery.supervision.events import read_events
from tests.harness import free_port, spawn, wait_for
from tests.integration.forensics._common import HangStack, shown_in_chromium, stacks_of
from tests.unit.integrations._launcher import env as launch_env

pytestmark = [
    pytest.mark.integration,
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.timeout(300),
]
JOB = "hang-job"
SCRIPT = Path(__file__).with_name("_hanging_script.py")
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[HangStack]:
    s = HangStack(tmp_path, free_port(), job=JOB, schedule=None)
    try:
        s.start_server()
        s.start_agent()
        yield s
    finally:
        s.stop()


class _Launch:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.err = open(run_dir.parent / "launch.err", "wb")  # noqa: SIM115
        self.proc = spawn(
            [
                sys.executable,
                "-m",
                "integrations.launch",
                "--run-dir",
                str(run_dir),
                "--job",
                JOB,
                "--role",
                "trainer",
                "--backoff",
                "0",
                "--",
                sys.executable,
                str(SCRIPT),
            ],
            cwd=ROOT,
            env=launch_env(),
            stdout=subprocess.DEVNULL,
            stderr=self.err,
        )

    def pid(self) -> int | None:
        beat = read_heartbeat(heartbeat_path(self.run_dir, "trainer", 0)) or {}
        return beat.get("pid") if beat.get("phase") == "TRAIN" else None

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in read_events(self.run_dir / "events.jsonl") if e["kind"] == kind]

    def logs(self) -> str:
        out = [(self.run_dir.parent / "launch.err").read_text(errors="replace")[-2000:]]
        for f in sorted((self.run_dir / "logs").glob("*.log")):
            out.append(f"--- {f.name}\n{f.read_text(errors='replace')[-1500:]}")
        return "\n".join(out)

    def close(self) -> None:
        for pid in [p for e in self.events("spawn") if (p := e.get("child_pid"))]:
            try:
                os.kill(pid, signal.SIGCONT)  # a stopped process cannot take the SIGTERM
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.err.close()


def _trains_past_first_steps(stack: DemoStack, launch: _Launch, logs: Any) -> int:
    """The pid of the trainer once the server saw it train past the job's first steps (a
    fault there is a first-step anomaly: heavy, waiting for an approver) and saw its pace (the
    hang detector judges only a trainer whose step it saw advance ``hang_min_steps`` + 1
    times). A restarted process counts from step 0 again and the server keeps the step it saw
    last until the new one reports: only heartbeats written by this process count."""

    def local() -> tuple[int, float] | None:
        beat = read_heartbeat(heartbeat_path(launch.run_dir, "trainer", 0)) or {}
        pid = launch.pid()
        if pid is None or beat.get("pid") != pid:
            return None
        return pid, float(beat["ts"])

    pid, since = wait_for(local, 90, "the trainer to report", context=logs)
    steps: set[int] = set()

    def paced() -> bool:
        r = stack.api("GET", f"/api/v1/jobs/{JOB}")
        if r.status_code == 200:
            steps.update(
                p["step"]
                for p in r.json()["participant_list"]
                if p["phase"] == "TRAIN"
                and datetime.fromisoformat(p["last_heartbeat_at"]).timestamp() >= since
            )
        return len({s for s in steps if s >= 5}) >= 8

    wait_for(
        paced, 90, "the server to see the trainer's step advance past 5, eight times", context=logs
    )
    return pid


def _check_captured_before_restart(
    stack: DemoStack, launch: _Launch, hung: int, function: str, logs: Any
) -> dict[str, Any]:
    inc, entry = wait_for(
        lambda: stacks_of(stack, JOB, hung), 90, f"the stacks of {hung}", context=logs
    )
    d = entry["detail"]
    assert d["ok"] is True, d
    assert function in d["text"] and f"Thread {hung}" in d["text"]
    assert "train_forever" in d["text"]  # the caller, on the same stack

    # Before the restart: the timeline has the stacks before the restart's result, and the
    # launcher captured them before it killed the hung process.
    def restart_done() -> dict[str, Any] | None:
        acts = [a for a in stack.incident(inc["id"])["actions"] if a["action"] == "restart_role"]
        return acts[0] if acts and acts[0]["status"] in ("succeeded", "failed") else None

    act = wait_for(restart_done, 90, "restart_role to finish", context=logs)
    assert act["status"] == "succeeded", act
    timeline = stack.incident(inc["id"])["timeline"]
    kinds = [e["type"] for e in timeline]
    assert kinds.index("stacks_captured") < kinds.index("action_succeeded")
    captured = [e for e in launch.events("stacks_captured") if e["child_pid"] == hung]
    restarts = [e for e in launch.events("restart") if e["ts"] >= captured[0]["ts"]]
    assert captured and restarts, launch.logs()
    assert datetime.fromisoformat(d["captured_at"]).timestamp() <= restarts[0]["ts"]
    new = wait_for(
        lambda: (p := launch.pid()) not in (None, hung) and p,
        60,
        "the restarted trainer",
        context=logs,
    )
    assert new != hung
    return inc


def test_stacks_of_a_busy_and_of_a_stopped_trainer_are_on_their_incidents(
    stack: DemoStack, browser: object
) -> None:
    launch = _Launch(stack.run_dir)

    def logs() -> str:
        server = (stack.workdir / "logs" / "server.log").read_text(errors="replace")[-3000:]
        incidents = [
            (
                i["kind"],
                i["status"],
                [
                    (a["action"], a["status"], a.get("error"))
                    for a in stack.incident(i["id"])["actions"]
                ],
                [e["type"] for e in stack.incident(i["id"])["timeline"]],
            )
            for i in stack.incidents()
        ]
        return f"{launch.logs()}\n--- incidents {incidents}\n--- server\n{server}"

    try:
        busy = _trains_past_first_steps(stack, launch, logs)
        (stack.run_dir / "spin").touch()  # the trainer spins: step frozen, heartbeat fresh
        spun = _check_captured_before_restart(stack, launch, busy, "spin_without_progress", logs)
        assert spun["kind"] == "train_hang"

        stopped = _trains_past_first_steps(stack, launch, logs)
        os.kill(stopped, signal.SIGSTOP)  # frozen whole, heartbeat included
        frozen = _check_captured_before_restart(stack, launch, stopped, "train_forever", logs)
        [entry] = [
            e
            for e in frozen["timeline"]
            if e["type"] == "stacks_captured" and e["detail"]["pid"] == stopped
        ]
        assert entry["detail"]["nonblocking"] is True  # read without pausing it again

        shown_in_chromium(stack, browser, spun["id"], "spin_without_progress")
    finally:
        launch.close()
