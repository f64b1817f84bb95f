"""On the node's worker: ask the node's launcher to inject the drill, and record its answer.

The request travels as RLGuard's recovery actions do: the worker runs the launcher hook
(``RLGUARD_RECOVERY_LAUNCHER``) with the verb ``inject_fault`` (``recovery.supervision.drills``)
and the drill's own idempotency key (``drill-<id>``): a task delivered twice asks once. A drill
armed for a step the process has not reached is not answered yet: the hook times out (exit 3)
and the task asks again later with the same key, never holding the worker meanwhile.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.drills.service import get_drill
from app.models.drill import Drill, DrillStatus

# What of the launcher's answer is kept on the row (its own words, bounded).
_ANSWER_FIELDS = (
    "what",
    "target",
    "target_pid",
    "step",
    "injected_at",
    "fault",
    "oom_step",
    "unwritable_seconds",
    "dry_run",
)
# A launcher asked for an immediate injection answers within a supervision round; one that
# has not within this long is stuck (or gone) and the drill is refused.
_IMMEDIATE_GIVE_UP = timedelta(seconds=60)


class Next(StrEnum):
    DONE = "done"  # nothing more for this task (refused, planned, or already answered)
    FOLLOW = "follow"  # injected: follow the incident and the recovery
    ASK_AGAIN = "ask_again"  # armed for its step (or not answered yet): ask again later


@dataclass(frozen=True, slots=True)
class HookSetup:
    """The node worker's launcher hook (None: not configured) and how long one ask waits."""

    launcher: str | None
    wait_seconds: float = 5.0
    arm_timeout_seconds: float = 1800.0


def give_up_after(setup: HookSetup, row: Drill) -> timedelta:
    """How long after its request the worker stops asking for the drill's answer."""
    return (
        timedelta(seconds=setup.arm_timeout_seconds)
        if row.at_step is not None
        else _IMMEDIATE_GIVE_UP
    )


def hook_argv(setup: HookSetup, row: Drill) -> list[str]:
    """The hook's command line: every value joined to its option, as the action worker does.
    ``expires_at``: when the worker gives up; a launcher that finds the request later (stuck,
    or back from a pause) refuses it as stale instead of injecting a fault nobody follows."""
    assert setup.launcher is not None
    expires = (row.requested_at.astimezone(UTC) + give_up_after(setup, row)).timestamp()
    extra = {
        "fault": row.fault,
        "drill": f"drill-{row.id}",
        "at_step": row.at_step,
        "dry_run": row.plan,
        "expires_at": round(expires, 3),
    }
    return [
        setup.launcher,
        "inject_fault",
        f"--job={row.job}",
        f"--node={row.node}",
        f"--role={row.role}",
        f"--rank={row.rank}",
        f"--idempotency-key=drill-{row.id}",
        f"--extra={json.dumps(extra, sort_keys=True)}",
        f"--wait={setup.wait_seconds:g}",
    ]


def ask_launcher(engine: Engine, drill_id: int, setup: HookSetup, *, now: datetime) -> Next:
    """Ask once and record what the launcher answered; what the task does next."""
    with Session(engine, expire_on_commit=False) as session:
        row = get_drill(session, drill_id)
    if row.status != DrillStatus.requested.value:
        return Next.DONE
    if not setup.launcher:
        return _record(
            engine,
            drill_id,
            refused=f"the worker of node {row.node!r} has no "
            "launcher hook (RLGUARD_RECOVERY_LAUNCHER is not set there)",
        )
    try:
        proc = subprocess.run(
            hook_argv(setup, row),
            capture_output=True,
            text=True,
            timeout=setup.wait_seconds + 15,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return _record(engine, drill_id, refused=f"cannot run the launcher hook: {exc}")
    if proc.returncode == 3:  # not answered within the wait: armed for its step, or busy
        limit = give_up_after(setup, row)
        if now - row.requested_at.astimezone(UTC) < limit:
            return Next.ASK_AGAIN
        why = (
            f"step {row.at_step} did not come within {limit.total_seconds():g} s"
            if row.at_step is not None
            else f"the launcher did not answer within {limit.total_seconds():g} s"
        )
        return _give_up(engine, setup, row, why, now=now)
    return _recorded_answer(engine, drill_id, proc)


def _recorded_answer(engine: Engine, drill_id: int, proc: subprocess.CompletedProcess[str]) -> Next:
    answer = _answer(proc.stdout)
    if proc.returncode == 0 and answer.get("ok"):
        return _record(engine, drill_id, answer=answer)
    lines = proc.stderr.strip().splitlines()
    why = str(answer.get("error") or (lines[-1] if lines else f"exit {proc.returncode}"))
    return _record(
        engine, drill_id, refused=f"the launcher refused: {why.removeprefix('refused: ')}"
    )


def _give_up(engine: Engine, setup: HookSetup, row: Drill, why: str, *, now: datetime) -> Next:
    """Withdraw the request from the launcher's directory before refusing the drill, so that
    the launcher cannot inject it later. The withdrawal and the launcher's claim are atomic
    (one file created once): when the launcher took it first, its answer is the drill's."""
    assert setup.launcher is not None
    argv = [
        setup.launcher,
        "withdraw",
        f"--job={row.job}",
        f"--node={row.node}",
        f"--idempotency-key=drill-{row.id}",
        f"--extra={json.dumps({'why': why})}",
    ]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return _record(
            engine,
            row.id or 0,
            refused=f"{why}; withdrawing it failed ({exc}): "
            "the launcher refuses it as stale once it expired",
        )
    body = _answer(proc.stdout)
    if body.get("withdrawn") is True:
        return _record(engine, row.id or 0, refused=f"{why}: the request was withdrawn")
    answered = body.get("answer")
    if isinstance(answered, dict):  # the launcher answered just before: that is the drill's
        return _recorded_answer(
            engine,
            row.id or 0,
            subprocess.CompletedProcess(
                argv, 0 if answered.get("ok") else 1, json.dumps(answered), ""
            ),
        )
    if body.get("taken") is True and now - row.requested_at.astimezone(UTC) < (
        give_up_after(setup, row) + _IMMEDIATE_GIVE_UP
    ):
        return Next.ASK_AGAIN  # the launcher is injecting it now: its answer follows
    if body.get("taken") is True:
        return _record(
            engine,
            row.id or 0,
            refused=f"{why}; the launcher took the request and "
            "never answered: whether it injected the fault is unknown, check the process",
        )
    lines = proc.stderr.strip().splitlines()
    detail = lines[-1] if lines else f"exit {proc.returncode}"
    return _record(
        engine,
        row.id or 0,
        refused=f"{why}; it could not be withdrawn ({detail}): "
        "the launcher refuses it as stale once it expired",
    )


def _answer(stdout: str) -> dict[str, Any]:
    lines = stdout.strip().splitlines()
    try:
        body = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        return {}
    return body if isinstance(body, dict) else {}


def _record(
    engine: Engine,
    drill_id: int,
    *,
    refused: str | None = None,
    answer: dict[str, Any] | None = None,
) -> Next:
    with Session(engine, expire_on_commit=False) as session:
        row = get_drill(session, drill_id)
        if row.status != DrillStatus.requested.value:
            return Next.DONE  # answered by another delivery of the task
        nxt = Next.DONE
        if refused is not None:
            row.status, row.reason = DrillStatus.refused.value, refused[:1000]
        elif answer is not None:
            row.answer = {k: answer[k] for k in _ANSWER_FIELDS if k in answer}
            row.answer["what"] = str(row.answer.get("what", ""))[:500]
            if row.plan:
                row.status = DrillStatus.planned.value
            else:
                row.status = DrillStatus.injected.value
                at = answer.get("injected_at")
                row.injected_at = (
                    datetime.fromtimestamp(float(at), UTC) if isinstance(at, int | float) else None
                )
                pid, step = answer.get("target_pid"), answer.get("step")
                row.target_pid = pid if isinstance(pid, int) else None
                row.step_at_injection = step if isinstance(step, int) else None
                nxt = Next.FOLLOW
        session.add(row)
        session.commit()
    return nxt
