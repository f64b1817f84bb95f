"""What every detector shares: the ``Detector`` base class and the helpers to read series.

Each detector is small and answers one question. A detector emits a signal on every tick that
its condition holds (the engine groups repeated signals into one incident and resolves it once
the signal has been absent for the quiet period). Time always comes from ``world.now``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from app.policy.policy_file import Policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject, Tier
from app.policy.world import ParticipantView, Threshold, World
from app.series.store import Point, SeriesKey
from recovery.protocol import metric_names as m


def subject_of(key: SeriesKey) -> Subject:
    rank = key.label(m.LABEL_RANK)
    return Subject(
        node=key.node,
        job=key.label(m.LABEL_JOB),
        role=key.label(m.LABEL_ROLE),
        rank=int(rank) if rank is not None and rank.lstrip("-").isdigit() else None,
        gpu=key.label(m.LABEL_GPU),
    )


def participant_subject(p: ParticipantView) -> Subject:
    return Subject(node=p.node, job=p.job, role=p.role, rank=p.rank)


class Detector:
    """Base class: ``detect`` returns the signals whose condition holds at ``world.now``."""

    #: metric names this detector reads from ``world.latest`` every tick
    metrics: tuple[str, ...] = ()
    #: per name: which series the snapshot keeps (a Threshold on the newest value, CHANGED, or
    #: a BreachRun); a name without a filter comes whole. A filter is a standing question that
    #: ingest keeps answered (``LatestIndex``): it keeps the tick cheap at cluster scale.
    filters: dict[str, object] = {}
    #: names read only on demand (``world.all_series``), never snapshotted
    lookups: tuple[str, ...] = ()

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._since: dict[object, float] = {}
        self._since_now: dict[object, float] = {}

    def run(self, world: World) -> list[FaultSignal]:
        """``detect`` plus bookkeeping: conditions that did not hold this tick are forgotten."""
        self._since_now = {}
        out = self.detect(world)
        self._since = self._since_now
        return out

    def sticky_since(self, ident: object, start: float, *, open_ended: bool) -> float:
        """Keep the start of a condition stable while it lasts.

        Detectors look back over a bounded window; when the condition fills the whole window
        (``open_ended``) its true start lies further back: keep the start seen on earlier ticks,
        so one long breach stays one occurrence instead of a start that moves every tick.
        """
        prev = self._since.get(ident)
        if open_ended and prev is not None and prev <= start:
            start = prev
        self._since_now[ident] = start
        return start

    def tier(self, kind: FaultKind) -> Tier:
        return self.policy.tier_rule(kind).tier

    def signal(
        self,
        world: World,
        kind: FaultKind,
        subject: Subject,
        evidence: Evidence,
        *,
        since: float | None,
        step: int | None = None,
        **extra: object,
    ) -> FaultSignal:
        sig = FaultSignal(
            kind=kind,
            subject=subject,
            evidence=evidence,
            suggested_tier=self.tier(kind),
            detected_at=world.now,
            since=since,
            step=step,
            extra=dict(extra),
        )
        tier = self.policy.rule_for(sig).tier  # a gpu_xid's tier is its XID's bucket's
        return sig if tier is sig.suggested_tier else replace(sig, suggested_tier=tier)

    def detect(self, world: World) -> list[FaultSignal]:  # pragma: no cover - interface
        raise NotImplementedError

    def fresh(self, world: World, point: Point) -> bool:
        return world.now - point.ts <= self.policy.detection.stale_sample_seconds


def at_least_one(value: float) -> bool:
    return value >= 1


AT_LEAST_ONE = Threshold("ge", 1.0)


def breach_run(points: list[Point], breaches: Callable[[float], bool]) -> list[Point]:
    """The newest contiguous run of points that satisfy ``breaches`` (oldest first)."""
    run: list[Point] = []
    for p in reversed(points):
        if not breaches(p.value):
            break
        run.append(p)
    run.reverse()
    return run


class StartupGrace:
    """Start-up grace (``detection.startup``): which participants are still starting.

    A participant is starting while its phase is a start-up phase (``STARTING``: its launcher
    started it and keeps its heartbeat, the process has not reported for itself yet) and for
    the rest of its role's ``startup_grace_seconds`` after it was first seen in one (an engine
    that reports but still loads and compiles), until its step moves past the step it first
    reported for itself: a process that has finished a step has started, and a hang after that
    is judged at once, not when the grace ends. Each sighting of a start-up phase after some
    other phase is a new start (a restart). One still in a start-up phase when its grace is
    over never sent its first heartbeat: ``overdue``. Exited and finished phases end a start.

    Participants never seen in a start-up phase are never starting: with none in start-up,
    the detectors behave as without this class. Memory is per detector instance (kept across
    an engine resync, lost with the process: a participant starting across a server restart
    gets its grace again from the moment the new process sees it).
    """

    GRACE = "grace"
    OVERDUE = "overdue"

    def __init__(self, policy: Policy) -> None:
        self.cfg = policy.detection.startup
        hb = policy.detection.heartbeat
        self._gone = frozenset(hb.exited_phases + hb.finished_phases)
        self.phases = frozenset(self.cfg.phases)
        # participant → (start of its current start-up, still in a start-up phase last seen,
        # the step it first reported for itself: None while its launcher still speaks for it)
        self._starts: dict[tuple[str, str, int], tuple[float, bool, int | None]] = {}

    @property
    def under_way(self) -> Mapping[tuple[str, str, int], object]:
        """The starts being followed (kept up to date in place). While it is empty, a
        participant not in one of :attr:`phases` is not starting and :meth:`check` would return
        None and remember nothing: a loop over thousands of participants may skip the call
        (``check(p, now) if under_way or p.phase in phases else None``)."""
        return self._starts

    def started_at(self, p: ParticipantView) -> float | None:
        entry = self._starts.get(p.key)
        return entry[0] if entry is not None else None

    def check(self, p: ParticipantView, now: float) -> str | None:
        """``GRACE``, ``OVERDUE`` or None (not starting); call it for each participant on
        every tick, before any early ``continue``, so that a start is seen when it begins."""
        if not self._starts and p.phase not in self.cfg.phases:
            return None  # the common case: nobody starting
        prev = self._starts.get(p.key)
        grace = self.cfg.grace_seconds(p.role)
        if p.phase in self.cfg.phases:
            start = now if prev is None or not prev[1] else prev[0]
            self._starts[p.key] = (start, True, None)
            return self.OVERDUE if now - start >= grace else self.GRACE
        if prev is None:
            return None
        first_step = p.step if prev[2] is None else prev[2]
        if p.phase in self._gone or now - prev[0] >= grace or p.step > first_step:
            del self._starts[p.key]
            return None
        self._starts[p.key] = (prev[0], False, first_step)
        return self.GRACE


ParticipantKey = tuple[str, str, int]  # (job, role, rank), as ParticipantView.key


class ParticipantSeries:
    """Which series of one metric belongs to which participant (job, role, rank).

    Parsing every key's labels on every tick would cost more than the rest of the tick at
    cluster scale, so the map is kept while the number of series in the store is unchanged
    (a new participant adds series; the store drops a dead one's after its window). A
    participant may own several series of one name (its heartbeat's and its engine's).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._size = -1
        self._by_participant: dict[ParticipantKey, list[SeriesKey]] = {}
        self._owner: dict[SeriesKey, ParticipantKey] = {}
        self._rings: dict[tuple[str, ...], dict[tuple[str, str], list[OwnedRing]]] = {}

    def _refresh(self, world: World) -> None:
        size = len(world.store)
        if size == self._size:
            return
        by_participant: dict[ParticipantKey, list[SeriesKey]] = {}
        owner: dict[SeriesKey, ParticipantKey] = {}
        for k, _ in world.all_series(self.name):
            sub = subject_of(k)
            if sub.job is not None and sub.role is not None and sub.rank is not None:
                pkey = (sub.job, sub.role, sub.rank)
                by_participant.setdefault(pkey, []).append(k)
                owner[k] = pkey
        self._size, self._by_participant, self._owner = size, by_participant, owner
        self._rings = {}

    def of(self, world: World, participant: ParticipantKey) -> list[SeriesKey]:
        self._refresh(world)
        return self._by_participant.get(participant, [])

    def by_participant(self, world: World) -> Mapping[ParticipantKey, list[SeriesKey]]:
        """Every participant with series of the name → its series: for a loop over the
        participants, which then pays the store's size check once, not once each."""
        self._refresh(world)
        return self._by_participant

    def owners(self, world: World) -> dict[SeriesKey, ParticipantKey]:
        """Every series of the name → its participant (series without one are absent)."""
        self._refresh(world)
        return self._owner

    def rings(self, world: World, roles: tuple[str, ...]) -> dict[tuple[str, str], list[OwnedRing]]:
        """Per (job, role) in ``roles``, one series per participant with its sample buffer
        read in place (:meth:`World.rings`): for a loop over every series of a tick, with no
        key hashed and nothing allocated per series. Of a participant's several series (its
        heartbeat's and its engine's) the heartbeat's (no ``engine`` label) is kept."""
        self._refresh(world)
        groups = self._rings.get(roles)
        if groups is None:
            chosen: dict[ParticipantKey, tuple[SeriesKey, Sequence[tuple[float, float]]]] = {}
            for key, points in world.rings(self.name):
                pkey = self._owner.get(key)
                if pkey is None or pkey[1] not in roles:
                    continue
                if pkey not in chosen or chosen[pkey][0].label(m.LABEL_ENGINE) is not None:
                    chosen[pkey] = (key, points)
            groups = {}
            for pkey, (key, points) in chosen.items():
                groups.setdefault((pkey[0], pkey[1]), []).append((points, key, pkey))
            self._rings[roles] = groups
        return groups


# A series' sample buffer (newest last), its key and its participant.
OwnedRing = tuple[Sequence[tuple[float, float]], SeriesKey, ParticipantKey]
