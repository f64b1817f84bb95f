"""The Approvals page: the queue of heavy-tier plans, each with its incident, and decisions.

Deciding goes through ``app.incidents.approvals.decide`` (the same call the REST API makes: role
check, final decisions, audit, timeline); this module only gathers what a person needs to see
before pressing a button.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlmodel import Session, col, select

from app.core.errors import NotFound
from app.incidents import approvals as approvals_service
from app.incidents.public import ApprovalPublic, approval_public
from app.models import User
from app.models.action import RecoveryAction
from app.models.approval import Approval
from app.models.incident import Incident

RECENT_DECIDED = 20


@dataclass(slots=True)
class ApprovalCard:
    approval: ApprovalPublic
    incident_id: int
    tier: str
    kind: str
    incident_summary: str
    job: str | None
    node: str | None
    safe_mode: bool
    expires_in: float  # seconds; negative once past

    @property
    def pending(self) -> bool:
        return self.approval.status == "pending"


def _cards(session: Session, approvals: list[ApprovalPublic], *, now: float) -> list[ApprovalCard]:
    ids = {a.incident_id for a in approvals}
    incidents = (
        {i.id: i for i in session.exec(select(Incident).where(col(Incident.id).in_(ids))).all()}
        if ids
        else {}
    )
    cards = []
    for a in approvals:
        inc = incidents.get(a.incident_id)
        cards.append(
            ApprovalCard(
                approval=a,
                incident_id=a.incident_id,
                tier=inc.tier if inc else "heavy",
                kind=inc.kind if inc else "?",
                incident_summary=inc.summary if inc else "",
                job=inc.job if inc else None,
                node=inc.node if inc else None,
                safe_mode=bool(inc and inc.safe_mode),
                expires_in=a.expires_at.timestamp() - now,
            )
        )
    return cards


def approval_queue(
    session: Session, *, now: float
) -> tuple[list[ApprovalCard], list[ApprovalCard]]:
    """(pending oldest first, the most recent decisions newest first)."""
    pending = approvals_service.list_approvals(session, status="pending", limit=1000)
    pending.sort(key=lambda a: a.requested_at)
    decided = [
        a
        for a in approvals_service.list_approvals(
            session, status="all", limit=RECENT_DECIDED + len(pending)
        )
        if a.status != "pending"
    ][:RECENT_DECIDED]
    return _cards(session, pending, now=now), _cards(session, decided, now=now)


def approval_card(session: Session, *, approval_id: int, now: float) -> ApprovalCard:
    row = session.get(Approval, approval_id)
    if row is None:
        raise NotFound(f"no approval with id {approval_id}")
    actions = session.exec(
        select(RecoveryAction)
        .where(RecoveryAction.approval_id == approval_id)
        .order_by(col(RecoveryAction.id))
    ).all()
    return _cards(session, [approval_public(row, list(actions))], now=now)[0]


def decide(
    session: Session, *, approval_id: int, user_id: int, approve: bool, comment: str
) -> None:
    """Approve or reject as the signed-in user and commit; errors come from the approvals service."""
    user = session.get(User, user_id)
    if user is None:
        raise NotFound(f"no user with id {user_id}")
    approvals_service.decide(
        session, approval_id=approval_id, user=user, approve=approve, comment=comment.strip()
    )
    session.commit()
