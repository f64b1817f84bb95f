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

from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.drills.launcher import HookSetup, _answer
from app.drills.service import get_drill
from app.models.drill import Drill, DrillStatus

_FIELDS = ("generations_redone", "generations_reused", "unit", "batches_redone", "source")


def figures_argv(setup: HookSetup, row: Drill) -> list[str]:
    assert setup.launcher is not None
    since = (row.injected_at or row.requested_at).timestamp()
    return [setup.launcher, "drill_figures", f"--job={row.job}", f"--node={row.node}",
            f"--role={row.role}", f"--rank={row.rank}", f"--idempotency-key=drill-{row.id}-figures",
            f"--extra={json.dumps({'since': since})}"]


def ask_figures(setup: HookSetup, row: Drill) -> dict[str, Any]:
    """The hook's count, or ``{"generations_redone": None, "generations_note": why}``."""
    if not setup.launcher:
        return _none(f"the worker of node {row.node!r} has no launcher hook to count them")
    try:
        proc = subprocess.run(figures_argv(setup, row), capture_output=True, text=True,
                              timeout=60, check=False)
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
    outcome = (row.report or {}).get("outcome")
    if row.status != DrillStatus.injected.value or outcome is None:
        return False
    counted = ask_figures(setup, row)
    with Session(engine, expire_on_commit=False) as session:
        row = get_drill(session, drill_id)
        if row.status != DrillStatus.injected.value:
            return False  # ended by another delivery of the task
        report = {k: v for k, v in (row.report or {}).items()
                  if k not in ("outcome", "generations_note")}
        report.update(counted)
        report["state"] = str(report.get("state", "")).split("; counting the generations")[0]
        row.report = report
        row.status = outcome
        row.finished_at = now
        session.add(row)
        session.commit()
    return True
