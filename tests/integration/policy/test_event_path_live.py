"""A launcher-seen exit is acted on as soon as its batch is durable, not at the next policy tick.

A real ``rlguard server`` (its policy tick every 60 s) and a real ``rlguard worker``, PostgreSQL +
Redis and embedded. The server's first tick runs before it serves and the next one 60 s later,
so a restart planned and sent within seconds of the exit's ingest ack, and started before a
tick's time has passed, can only have come from the event path (``app.ingest.certain`` → ``PolicyScheduler.nudge``); without it the action would start
a minute after the server did.
"""

from __future__ import annotations

import time

import httpx
import pytest
from sqlmodel import Session, select

from app.models.action import RecoveryAction
from tests.harness.stack import JOB, Stack, fast_policy

from .test_policy_scenarios import _action, _succeeded

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]

TICK_SECONDS = 60.0
# Far below the tick: the event path takes milliseconds; this allows for a loaded machine.
WITHIN_SECONDS = 10.0
# The worker, started with the server, may still be starting when the exit comes in (seconds on
# a loaded machine): the action's start is awaited this long, and judged against the tick.
START_TIMEOUT = 45.0


def _post(stack: Stack, seq: int, phase: str) -> float:
    """One agent batch from n0 with the trainer in ``phase``; returns when it was acknowledged."""
    now = time.time()
    body = {
        "agent_id": "agent-n0",
        "node": "n0",
        "seq": seq,
        "sent_at": now,
        "samples": [],
        "participants": [
            {"job": JOB, "role": "trainer", "rank": 0, "phase": phase, "step": 20, "ts": now}
        ],
        "fingerprint": None,
    }
    r = httpx.post(
        f"{stack.base_url}/api/v1/ingest",
        json=body,
        headers=stack.auth(stack.node_tokens["n0"]),
        timeout=10,
    )
    assert r.status_code == 200, r.text
    return time.time()


def _started(stack: Stack) -> RecoveryAction | None:
    with Session(stack.engine) as s:
        rows = s.exec(select(RecoveryAction).where(RecoveryAction.job == JOB)).all()
    return next((r for r in rows if r.started_at is not None), None)


def test_a_launcher_seen_exit_is_restarted_before_the_next_tick(stack: Stack) -> None:
    fast_policy(stack.tmp / "policy.yaml", tick_seconds=TICK_SECONDS)  # the server's policy file
    stack.run_dir(JOB)
    launched = time.time()  # the server's next tick runs no earlier than a tick after this
    stack.start_server()
    stack.start_worker("--node", "n0", "--cluster")
    _post(stack, 1, "TRAIN")
    acked = _post(stack, 2, "EXITED")

    action = stack.wait(lambda: _started(stack), START_TIMEOUT, "the restart to start")
    assert action.started_at is not None and action.dispatched_at is not None
    # Planned and sent to the broker as soon as the exit was durable...
    assert action.created_at.timestamp() - acked < WITHIN_SECONDS
    assert action.dispatched_at.timestamp() - acked < WITHIN_SECONDS
    # ...and started before the interval tick could even have planned it.
    assert action.started_at.timestamp() < launched + TICK_SECONDS

    done = stack.wait(
        lambda: _succeeded(stack, "heartbeat_lost", "restart_role"), 60, "the restart to succeed"
    )
    restart = _action(done, "restart_role")
    assert restart is not None and restart["attempts"] == 1
    # One incident, one action: the event path planned it, nothing planned it again.
    assert [i["kind"] for i in stack.incidents()] == ["heartbeat_lost"]
    assert [a["action"] for a in done["actions"]] == ["restart_role"]
    assert [c["event"] for c in stack.launcher_calls() if c["action"] == "restart_role"] == [
        "start",
        "done",
    ]
