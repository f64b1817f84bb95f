"""What each kind of recovery action is beyond its name: its Celery task, and what finishing it
does to the incident and the job.

The names themselves are ``ActionName`` (``app.policy.plans``), the one vocabulary the policy
file, the planner, the adapters and the tasks share. ``finish_action`` knows no action by name:
it asks the action's kind what a success means (``on_succeeded``) and whether a failure counts
as a failed recovery (``failure_counts``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlmodel import Session

from app.incidents.safe_mode_release import on_release_succeeded
from app.incidents.timeline import add_event
from app.models.action import RecoveryAction
from app.models.incident import Incident, IncidentEventType
from app.policy.plans import ActionName

TASK_PREFIX = "recovery."

#: What a succeeded action does beyond its own timeline entry (worker, when).
SuccessEffect = Callable[[Session, RecoveryAction, Incident, str, datetime], None]


def task_name(action: str) -> str:
    """The Celery task that carries out ``action`` (``recovery.<action>``)."""
    return TASK_PREFIX + action


def _job_entered_safe_mode(
    session: Session, row: RecoveryAction, inc: Incident, worker: str, now: datetime
) -> None:
    if inc.safe_mode:
        return
    inc.safe_mode = True
    add_event(
        session,
        incident_id=inc.id,
        type_=IncidentEventType.SAFE_MODE,
        actor=f"worker:{worker}",
        at=now,
        detail={"job": row.job, "node": row.node},
    )


def _job_released(
    session: Session, row: RecoveryAction, inc: Incident, worker: str, now: datetime
) -> None:
    on_release_succeeded(session, action=row, now=now)


@dataclass(frozen=True, slots=True)
class ActionKind:
    on_succeeded: SuccessEffect | None = None
    # A failure counts toward escalation; a release that failed is not a failed recovery.
    failure_counts: bool = True


_KINDS: dict[str, ActionKind] = {
    ActionName.ENTER_SAFE_MODE: ActionKind(on_succeeded=_job_entered_safe_mode),
    ActionName.RELEASE_SAFE_MODE: ActionKind(on_succeeded=_job_released, failure_counts=False),
}
_PLAIN = ActionKind()


def kind_of(action: str) -> ActionKind:
    """The kind of the action named ``action``: most have no effect beyond their own timeline
    entry, and a name no adapter knows (its action fails) is such a plain kind too."""
    return _KINDS.get(action, _PLAIN)
