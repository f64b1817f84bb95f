"""Why a process failed, as its own output said: the exit cause of an exited participant.

The launcher matches the tail of a failed process's output against the exit-cause catalogue
(``recovery/supervision/exit_causes.yaml``) and writes the cause into the heartbeat with the
exit; the agent sends it as ``participant_exit_cause{cause, kind, line}`` (value: the exit's
time) in the same batch as the phase ``EXITED``. The heartbeat detector asks
:class:`ExitCauses` for the cause of each exit it reports: with one, the signal takes the
cause's kind (``cuda_oom``, ``collective_timeout``, ``storage_unwritable`` ...) and says
``exit_cause`` with the matched line as its evidence; without one it stays ``heartbeat_lost``,
as before.

A cause that comes back at the same step (the restarted process died of the same OOM at the
same step) carries ``same_step_failures``, which escalates it to heavy: restarting into the
same failure again fixes nothing. A collective timeout is about the role, not the rank that
printed it (the rank that timed out is usually waiting for a peer that never came): its
subject is the role, so its restart_role captures every rank's stacks and restarts them
together, and several ranks timing out together are one incident.
"""

from __future__ import annotations

from collections import OrderedDict

from app.policy.signals import Evidence, FaultKind, Subject
from app.policy.world import ParticipantView, World
from recovery.protocol import metric_names as m

# Exits remembered per (participant, cause) for "the same step again" (bounded: an LRU).
_REMEMBERED = 4096
# Kinds whose subject is the whole role of the job rather than the rank that printed it.
_ROLE_KINDS = frozenset({FaultKind.COLLECTIVE_TIMEOUT})
_KINDS = {k.value: k for k in FaultKind}


class ExitCause:
    """One exit's cause as the policy uses it."""

    __slots__ = ("cause", "kind", "line", "exit_ts")

    def __init__(self, cause: str, kind: FaultKind, line: str, exit_ts: float) -> None:
        self.cause, self.kind, self.line, self.exit_ts = cause, kind, line, exit_ts


class ExitCauses:
    """Finds the cause of a participant's exit and counts its repeats at one step."""

    lookups = (m.PARTICIPANT_EXIT_CAUSE,)

    def __init__(self) -> None:
        # (job, role, rank, cause) -> (step, exit times seen at that step)
        self._repeats: OrderedDict[tuple[str, str, int, str], tuple[int, set[float]]] = (
            OrderedDict()
        )

    def of(self, world: World, p: ParticipantView) -> ExitCause | None:
        """The cause its launcher reported for ``p``'s current exit, or None (unknown)."""
        best: ExitCause | None = None
        for key, point in world.all_series(m.PARTICIPANT_EXIT_CAUSE):
            if (key.label(m.LABEL_JOB), key.label(m.LABEL_ROLE), key.label(m.LABEL_RANK)) != (
                p.job,
                p.role,
                str(p.rank),
            ):
                continue
            # The value is the exit's heartbeat time: an earlier exit's cause is not this one's.
            if point.value < p.last_heartbeat_ts - 1.0:
                continue
            kind = _KINDS.get(key.label("kind") or "")
            cause = key.label("cause")
            if kind is None or not cause:
                continue
            if best is None or point.value > best.exit_ts:
                best = ExitCause(cause, kind, key.label("line") or "", point.value)
        return best

    def same_step_failures(self, p: ParticipantView, cause: ExitCause) -> int:
        """How many distinct exits of ``p`` this cause ended at ``p``'s current step."""
        ident = (p.job, p.role, p.rank, cause.cause)
        step, exits = self._repeats.pop(ident, (p.step, set()))
        if step != p.step:
            step, exits = p.step, set()
        exits.add(round(cause.exit_ts, 3))
        self._repeats[ident] = (step, exits)
        while len(self._repeats) > _REMEMBERED:
            self._repeats.popitem(last=False)
        return len(exits)

    @staticmethod
    def subject(p: ParticipantView, cause: ExitCause) -> Subject:
        if cause.kind in _ROLE_KINDS:
            return Subject(job=p.job, role=p.role)
        return Subject(node=p.node, job=p.job, role=p.role, rank=p.rank)

    @staticmethod
    def evidence(world: World, p: ParticipantView, cause: ExitCause) -> Evidence:
        return Evidence(
            metric=m.PARTICIPANT_EXIT_CAUSE,
            values=((cause.exit_ts, 1.0),),
            window_seconds=0.0,
            threshold=None,
            detail=f"{p.role}-{p.rank} exited (reported by its launcher "
            f"{world.now - p.last_heartbeat_ts:.0f}s ago); exit_cause: {cause.cause}, "
            f"its output said: {cause.line}",
        )
