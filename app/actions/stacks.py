"""The worker's side of hang forensics: put the stacks a restart captured on its incident at
once, in a transaction of their own, before the restart itself is asked for.

The action's result is recorded only when the adapter returns (after the restart, which may
wait for a backoff or SAFE_MODE); the stacks are worth having before then. A database that is
away at that moment costs the stacks (logged, and said in the action's result), never the
restart.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlmodel import Session

from app.actions.machine import ActionSnapshot
from app.incidents.stacks import record_stacks
from app.models._types import utcnow
from recovery.supervision.stacks import DEFAULT_MAX_BYTES

log = logging.getLogger("rlguard.actions.stacks")


def attach_stacks(
    engine: Engine, worker: str, action: ActionSnapshot, captures: Sequence[dict[str, Any]]
) -> bool:
    """Record ``captures`` on ``action``'s incident now; False when the database refused."""
    wanted = action.params.get("capture_stacks")
    max_bytes = DEFAULT_MAX_BYTES
    if isinstance(wanted, dict) and isinstance(wanted.get("max_bytes"), int):
        max_bytes = wanted["max_bytes"]
    try:
        with Session(engine) as session:
            record_stacks(
                session,
                incident_id=action.incident_id,
                action_id=action.id,
                node=action.node,
                captures=captures,
                actor=f"worker:{worker}",
                now=utcnow(),
                max_bytes=max_bytes,
            )
            session.commit()
    except OperationalError as exc:
        log.warning("action %s: stacks not recorded (database away): %s", action.id, exc)
        return False
    return True
