"""On the node's worker, when a drill is over: count the generations its fault made the job do
again, and end the drill.

The server knows steps, not generations: which rollouts a restart lost and generated again is
recorded only in the job's run directory (the reference job's rollout write-ahead log, TRL's
generation log). The node's launcher hook counts them there (its own ``drill_figures``,
:mod:`recovery.supervision.drill_figures`) from the injection on; the answer goes into the
report, or why there is no number (no hook, a hook that cannot count, a job that records no
generations). Either way the drill ends with the outcome the follow-up found.
"""

from __future__ import annotations

import json
import subprocess
from datetime import datetime
from typing import Any

from celery import Celery
from kombu.exceptions import KombuError
from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.drills import dispatch
from app.drills.launcher import HookSetup, _answer
from app.drills.service import get_drill
from app.models.drill import Drill, DrillStatus

_FIELDS = ("generations_redone", "generations_reused", "unit", "batches_redone", "source")


def figures_argv(setup: HookSetup, row: Drill) -> list[str]:
    assert setup.launcher is not None
    since = (row.injected_at or row.requested_at).timestamp()
    return [
        setup.launcher,
        "drill_figures",
        f"--job={row.job}",
        f"--node={row.node}",
        f"--role={row.role}",
        f"--rank={row.rank}",
        f"--idempotency-key=drill-{row.id}-figures",
        f"--extra={json.dumps({'since': since})}",
    ]


def ask_figures(setup: HookSetup, row: Drill) -> dict[str, Any]:
    """The hook's count, or ``{"generations_redone": None, "generations_note": why}``."""
    if not setup.launcher:
        return _none(f"the worker of node {row.node!r} has no launcher hook to count them")
    try:
        proc = subprocess.run(
            figures_argv(setup, row), capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return _none(f"cannot run the launcher hook: {exc}")
    answer = _answer(proc.stdout)
    if proc.returncode != 0 or not answer.get("ok"):
        lines = proc.stderr.strip().splitlines()
        why = answer.get("error") or (lines[-1] if lines else f"exit {proc.returncode}")
        return _none(f"the node's launcher hook cannot count them ({str(why)[:300]})")
    if answer.get("generations_redone") is None:
        return _none(str(answer.get("note") or "the hook gave no figure")[:500])
    return {k: answer[k] for k in _FIELDS if k in answer}


def _none(why: str) -> dict[str, Any]:
    text = why if why.startswith("not measured") else f"not measured: {why}"
    return {"generations_redone": None, "generations_note": text}


def generations_text(report: dict[str, Any]) -> str:
    """The report's generations line: the number with its unit, or why there is none."""
    n = report.get("generations_redone")
    if n is None:
        return str(report.get("generations_note") or "—")
    unit = str(report.get("unit", "generations"))
    text = f"{n} {_counted(n, unit)}"
    reused = report.get("generations_reused")
    if reused is not None:
        text += f" ({reused} logged {_counted(reused, unit)} reused instead)"
    return text


def _counted(n: Any, unit: str) -> str:
    """``unit`` for ``n`` of them (the units are plurals: rollouts, batches)."""
    if n != 1:
        return unit
    return unit[:-2] if unit.endswith("ches") else unit.removesuffix("s")


def finish_drill(engine: Engine, drill_id: int, setup: HookSetup, *, now: datetime) -> bool:
    """Count, record and end the drill; False when it was not waiting for its count."""
    with Session(engine, expire_on_commit=False) as session:
        row = get_drill(session, drill_id)
    if not waits_for_count(row):
        return False
    return _end(engine, drill_id, ask_figures(setup, row), now)


def request_figures(
    celery: Celery, engine: Engine, drill_id: int, node: str, *, now: datetime
) -> bool:
    """Ask ``node``'s worker to count and end the drill (the follow-up, when it is over). When
    the broker refuses the task, the drill ends here without its count, saying why: otherwise
    it would stay ``injected`` for good, its outcome never shown. True: sent."""
    try:
        dispatch.send_figures(celery, drill_id, node)
    except (KombuError, OSError) as exc:
        why = f"the count could not be sent to the worker of node {node!r} ({type(exc).__name__}: {exc})"
        _end(engine, drill_id, _none(why[:500]), now)
        return False
    return True


def waits_for_count(row: Drill) -> bool:
    """Over (the follow-up set its outcome) and not yet ended: its node is to count it."""
    return row.status == DrillStatus.injected.value and "outcome" in (row.report or {})


def _end(engine: Engine, drill_id: int, counted: dict[str, Any], now: datetime) -> bool:
    """Record ``counted`` and end the drill with the follow-up's outcome (once)."""
    with Session(engine, expire_on_commit=False) as session:
        row = get_drill(session, drill_id)
        if not waits_for_count(row):
            return False  # ended by another delivery of the task
        report = {
            k: v for k, v in (row.report or {}).items() if k not in ("outcome", "generations_note")
        }
        report.update(counted)
        report["state"] = str(report.get("state", "")).split("; counting the generations")[0]
        row.status = (row.report or {})["outcome"]
        row.report = report
        row.finished_at = now
        session.add(row)
        session.commit()
    return True
