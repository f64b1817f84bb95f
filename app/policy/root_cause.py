"""One incident per root cause, not one per signal (no alert storm).

Two ways signals that one fault raises become one:

- A signal of one kind about a participant makes one of another kind about the same participant
  redundant (``SUPERSEDES``): a dead rollout is ``rollout_down``, a SIGSTOPped trainer is hung
  (``train_hang``) though its heartbeat goes silent too, a rollout whose engine died is
  ``rollout_engine_dead`` though it exits too. The redundant signal is dropped.
- Signals of kinds that share a cause about the same subject fold into one
  (``SAME_ROOT_CAUSE``): an XID 79 is the GPU falling off the bus, which the agent also
  reports as a lost GPU. The incident keeps one kind; the other signals ride in its evidence
  (``FaultSignal.related``) and add their plans to its plan (``Classifier``).
"""

from __future__ import annotations

from dataclasses import replace

from app.policy.signals import Evidence, FaultKind, FaultSignal

SUPERSEDES = {
    FaultKind.ROLLOUT_DOWN: FaultKind.HEARTBEAT_LOST,
    FaultKind.TRAIN_HANG: FaultKind.HEARTBEAT_LOST,
    # A rollout whose engine died exits (its host ends with its engine): its heartbeat_lost is
    # that death again, and a second restart_role would kill the replacement the first started.
    FaultKind.ROLLOUT_ENGINE_DEAD: FaultKind.HEARTBEAT_LOST,
}

# A job-level signal that explains per-participant ones of the same job: a trainer waiting in
# a cross-role deadlock is not hung by itself (its step is frozen because no data comes).
JOB_SUPERSEDES = {
    FaultKind.CROSS_ROLE_DEADLOCK: (FaultKind.TRAIN_HANG, FaultKind.TRAINER_IDLE),
}

# Per group, the kind an incident takes when its signals come together (the cause first).
SAME_ROOT_CAUSE: tuple[tuple[FaultKind, ...], ...] = ((FaultKind.GPU_XID, FaultKind.GPU_LOST),)


def drop_superseded(signals: list[FaultSignal]) -> list[FaultSignal]:
    present = {(s.kind, s.subject.job, s.subject.role, s.subject.rank) for s in signals}
    explained = {
        (loser, s.subject.job) for s in signals for loser in JOB_SUPERSEDES.get(s.kind, ())
    }
    out = []
    for s in signals:
        if explained and (s.kind, s.subject.job) in explained:
            continue
        hidden = any(
            winner_kind
            for winner_kind, loser in SUPERSEDES.items()
            if s.kind is loser
            and (winner_kind, s.subject.job, s.subject.role, s.subject.rank) in present
        )
        if not hidden:
            out.append(s)
    return out


def fold_same_root_cause(
    signals: list[FaultSignal], tracked: dict[str, float | None]
) -> list[FaultSignal]:
    """One signal per root cause (``SAME_ROOT_CAUSE``), in the place of its first member.

    ``tracked``: the incident keys the engine follows (open, or closed elsewhere while still
    reported) with the ``since`` of their occurrence. A group whose incident exists stays in
    it whichever of its kinds is reported now: the XID's signal ends after its hold while the
    GPU stays lost, and the lost GPU keeps the XID's incident open rather than opening its own.
    """
    groups: dict[tuple[tuple[FaultKind, ...], str], list[FaultSignal]] = {}
    for s in signals:
        kinds = _group_of(s.kind)
        if kinds is not None:
            groups.setdefault((kinds, s.subject.key()), []).append(s)
    if not groups:
        return signals
    out: list[FaultSignal] = []
    for s in signals:
        kinds = _group_of(s.kind)
        if kinds is None:
            out.append(s)
            continue
        members = groups.pop((kinds, s.subject.key()), None)
        if members is not None:  # None: already folded at its first member
            out.append(_fold(kinds, members, tracked))
    return out


def _group_of(kind: FaultKind) -> tuple[FaultKind, ...] | None:
    return next((g for g in SAME_ROOT_CAUSE if kind in g), None)


def _fold(
    kinds: tuple[FaultKind, ...], members: list[FaultSignal], tracked: dict[str, float | None]
) -> FaultSignal:
    subject_key = members[0].subject.key()
    owner = next((k for k in kinds if f"{k.value}:{subject_key}" in tracked), None)
    if owner is None:
        owner = next(k for k in kinds if any(m.kind is k for m in members))
    own = next((m for m in members if m.kind is owner), None)
    others = tuple(m for m in members if m is not own)
    if own is None:
        # The incident's own signal is over, another of its cause still holds: the same
        # occurrence goes on (its since unchanged, so no new occurrence is recorded).
        first = members[0]
        own = replace(
            first,
            kind=owner,
            since=tracked[f"{owner.value}:{subject_key}"],
            evidence=Evidence(metric=None, detail=f"{owner.value} no longer reported"),
            extra={},
        )
    if not others:
        return own
    detail = "; ".join(
        [own.evidence.detail, *(f"also {o.kind.value}: {o.evidence.detail}" for o in others)]
    )
    return replace(own, evidence=replace(own.evidence, detail=detail), related=others)
