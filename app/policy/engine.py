"""The policy engine: one ``tick(world)`` runs the detectors, classifies, and decides.

The engine is pure (no database, no clock of its own): given the same worlds in the same order
it makes the same decisions, which is what makes trace replay and fast tests possible. The
server persists the decisions (app.incidents.persist) and tells the engine about recovery
outcomes (``set_recovery_failures``, ``set_plan_succeeded``) and incidents closed elsewhere
(``forget``).

A failed local recovery is planned once more and escalates when it fails again (DESIGN.md,
"Escalation"). A recovery that did not hold fails too: the plan succeeded, the fault went away,
and it is back while its incident is still open (a participant restarted by a successful
``restart_role`` crashes again inside the quiet period). Otherwise a new occurrence is only
recorded: a plan still pending or running is not planned twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum

from app.policy.classifier import Classification, Classifier, choose_actions
from app.policy.correlated import fold_node_gpu_failures
from app.policy.detectors import (
    Detector,
    HeartbeatDetector,
    NodeSilenceDetector,
    default_detectors,
)
from app.policy.open_budget import NodeOpenBudget
from app.policy.plans import PlannedAction
from app.policy.policy_file import Policy
from app.policy.root_cause import drop_superseded, fold_same_root_cause
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject, Tier
from app.policy.world import LatestIndex, NodeReturns, ParticipantView, World
from recovery.protocol import metric_names as m

log = logging.getLogger("rlguard.policy")


class DecisionType(StrEnum):
    OPEN = "open"
    UPDATE = "update"
    ESCALATE = "escalate"
    RETRY = "retry"  # a local recovery failed: plan it once more before escalating
    RESOLVE = "resolve"


@dataclass(frozen=True, slots=True)
class IncidentDecision:
    type: DecisionType
    key: str
    kind: FaultKind
    subject: Subject
    tier: Tier
    at: float
    signal: FaultSignal | None
    actions: tuple[PlannedAction, ...] = ()
    reasons: tuple[str, ...] = ()
    # The fault came back after its plan succeeded: a failed local recovery the server has not
    # counted (no action failed), so it counts it when it persists this decision.
    recovery_did_not_hold: bool = False

    @property
    def detection_delay(self) -> float | None:
        if self.signal is None or self.signal.since is None:
            return None
        return self.at - self.signal.since


@dataclass(slots=True)
class OpenIncident:
    """What the engine remembers about an incident while it is open."""

    key: str
    kind: FaultKind
    subject: Subject
    tier: Tier
    opened_at: float
    last_active: float
    last_since: float | None = None
    # the newest evidence of the occurrence seen so far (a counter's newest rise), if any
    last_newest: float | None = None
    escalated: bool = False
    recovery_failures: int = 0
    # failures already answered by a retry of the local plan
    retried_failures: int = 0
    # Every action of the newest plan succeeded (the server says so, like recovery_failures).
    plan_succeeded: bool = False
    # The signal was quiet on some tick since the newest plan was made: the fault went away.
    quiet_since_plan: bool = False


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One occurrence of a signal: since when it holds, and its newest evidence (if known)."""

    since: float | None
    newest: float | None = None

    def covers(self, sig: FaultSignal) -> bool:
        """True if ``sig`` still reports this occurrence, or one that began before it (the
        same fault seen by another detector: a trainer whose checkpoint save failed on a full
        disk both exits with ENOSPC and counts a write error, one incident key, two
        ``since``), and nothing newer than it."""
        if sig.since is None or self.since is None:
            if sig.since != self.since:
                return False
        elif sig.since > self.since:
            return False  # it began after the closed occurrence: a new one
        newest = _newest(sig)
        return self.newest is None or newest is None or newest <= self.newest


def _newest(sig: FaultSignal) -> float | None:
    value = sig.extra.get("newest_at")
    return float(value) if isinstance(value, int | float) else None


@dataclass(slots=True)
class TickResult:
    at: float
    decisions: list[IncidentDecision] = field(default_factory=list)
    signals: list[FaultSignal] = field(default_factory=list)
    suspected_participants: list[ParticipantView] = field(default_factory=list)
    suspected_nodes: list[str] = field(default_factory=list)


class PolicyEngine:
    def __init__(
        self,
        policy: Policy,
        *,
        detectors: list[Detector] | None = None,
        closed_occurrences: dict[str, Occurrence] | None = None,
        node_returns: NodeReturns | None = None,
        open_budget: NodeOpenBudget | None = None,
    ) -> None:
        self.policy = policy
        # Incidents opened per node per minute (app.policy.open_budget); unbounded by default
        # (replay), the server passes node_quotas.incidents_per_minute. Kept across a resync.
        self.open_budget = open_budget or NodeOpenBudget(None)
        hb = policy.detection.heartbeat
        # A return is remembered twice the time a participant needs to be judged lost after
        # it, so the signal that judges it still says it was counted from the return.
        self.node_returns = node_returns or NodeReturns(
            hb.suspect_seconds, 2 * (hb.suspect_seconds + hb.confirm_seconds)
        )
        self.detectors = detectors if detectors is not None else default_detectors(policy)
        self.classifier = Classifier(policy)
        self._open: dict[str, OpenIncident] = {}
        # incident key -> the occurrence whose incident was closed elsewhere. A resync (fresh
        # engine, same detectors) must carry it over: the detectors still report that
        # occurrence, and without this memory it would open a second incident.
        self._closed_occurrence: dict[str, Occurrence] = dict(closed_occurrences or {})
        self._latest_index = _build_index(self.detectors)

    # -- state shared with the server ---------------------------------------------------------

    @property
    def open_incidents(self) -> dict[str, OpenIncident]:
        return dict(self._open)

    @property
    def closed_occurrences(self) -> dict[str, Occurrence]:
        """Occurrences whose incidents were closed elsewhere and are still being reported."""
        return dict(self._closed_occurrence)

    def limit_opens_per_node(self, per_minute: int | None) -> None:
        """Open at most ``per_minute`` incidents about one node per minute (None: no limit);
        beyond it one ``incident_flood`` incident per node (``app.policy.open_budget``)."""
        self.open_budget = NodeOpenBudget(per_minute)

    def restore(self, incidents: list[OpenIncident]) -> None:
        """Take over incidents that were open before a restart (from the database)."""
        for inc in incidents:
            self._open[inc.key] = inc
            self._closed_occurrence.pop(inc.key, None)  # open again: the database says so

    def forget(self, key: str) -> None:
        """The incident was closed outside the engine (its approved recovery completed, an
        operator closed it). The occurrence that opened it must not open it again: only a new
        occurrence does (a signal that began after it, or newer evidence than the incident had
        seen: more write errors after the restore), or the same one after a quiet tick."""
        inc = self._open.pop(key, None)
        if inc is not None:
            self._closed_occurrence[key] = Occurrence(inc.last_since, inc.last_newest)

    def set_recovery_failures(self, key: str, count: int) -> None:
        """How many local recoveries of this incident failed (kept in the database)."""
        inc = self._open.get(key)
        if inc is not None:
            inc.recovery_failures = count

    def set_plan_succeeded(self, key: str, succeeded: bool) -> None:
        """Whether every action of the incident's newest plan succeeded (from the database)."""
        inc = self._open.get(key)
        if inc is not None:
            inc.plan_succeeded = succeeded

    def record_recovery_failure(self, key: str) -> None:
        inc = self._open.get(key)
        if inc is not None:
            inc.recovery_failures += 1

    # -- the tick --------------------------------------------------------------------------

    def tick(self, world: World) -> TickResult:
        world.index_latest(self._latest_index.names, self._latest_index)
        world.node_back_at = self.node_returns.update(world.now, world.node_last_seen)
        signals: list[FaultSignal] = []
        result = TickResult(at=world.now)
        for det in self.detectors:
            signals.extend(det.run(world))
            if isinstance(det, HeartbeatDetector):
                result.suspected_participants = det.suspected
            elif isinstance(det, NodeSilenceDetector):
                result.suspected_nodes = det.suspected
        signals = [s for s in signals if not world.maintenance.covers(s)]
        tracked = self._tracked_occurrences()
        signals = fold_same_root_cause(drop_superseded(signals), tracked)
        signals = fold_node_gpu_failures(signals, tracked, self.policy, _gpu_count(world))
        result.signals = signals
        active: dict[str, FaultSignal] = {}
        for sig in signals:
            active.setdefault(sig.incident_key, sig)
        self._hold_over_budget(world, active, result)
        for key in [k for k in self._closed_occurrence if k not in active]:
            del self._closed_occurrence[key]
        for key, inc in self._open.items():
            if key not in active:
                inc.quiet_since_plan = True
        for key, sig in active.items():
            closed = self._closed_occurrence.get(key)
            if closed is not None and closed.covers(sig):
                continue  # the occurrence whose incident was just closed elsewhere
            self._closed_occurrence.pop(key, None)
            decision = self._on_signal(world, key, sig)
            if decision is not None:
                result.decisions.append(decision)
        result.decisions.extend(self._after_failed_recoveries(world, active))
        result.decisions.extend(self._resolve_quiet(world.now, active))
        for d in result.decisions:
            if d.type is DecisionType.OPEN and d.subject.node is not None:
                if d.kind is not FaultKind.INCIDENT_FLOOD:
                    self.open_budget.spend(d.subject.node, world.now)
        for d in result.decisions:
            log.info(
                "incident %s",
                d.type.value,
                extra={"incident": d.key, "tier": d.tier.value, "actions": len(d.actions)},
            )
        return result

    def _hold_over_budget(
        self, world: World, active: dict[str, FaultSignal], result: TickResult
    ) -> None:
        """Take the signals that would open an incident beyond their node's budget out of
        ``active`` (they open on a later tick) and put each such node's flood signal in."""
        would_open = []
        for key, sig in active.items():
            closed = self._closed_occurrence.get(key)
            if key not in self._open and not (closed is not None and closed.covers(sig)):
                would_open.append(sig)
        held = self.open_budget.hold(would_open, world.now)
        for key in held.keys:
            del active[key]
        for flood in self.open_budget.flood_signals(held, world.now):
            active.setdefault(flood.incident_key, flood)
            result.signals.append(flood)

    def _tracked_occurrences(self) -> dict[str, float | None]:
        """Every incident the engine follows, by key, with the since of its occurrence."""
        tracked = {key: occ.since for key, occ in self._closed_occurrence.items()}
        tracked.update((key, inc.last_since) for key, inc in self._open.items())
        return tracked

    def _on_signal(self, world: World, key: str, sig: FaultSignal) -> IncidentDecision | None:
        inc = self._open.get(key)
        job_step = self._job_step(world, sig)
        if inc is None:
            cls = self.classifier.classify(sig, job_step=job_step)
            self._open[key] = OpenIncident(
                key=key,
                kind=sig.kind,
                subject=sig.subject,
                tier=cls.tier,
                opened_at=world.now,
                last_active=world.now,
                last_since=sig.since,
                last_newest=_newest(sig),
                escalated=cls.escalated,
            )
            return self._decision(DecisionType.OPEN, key, sig, cls, world)
        inc.last_active = world.now
        inc.last_newest = _newest(sig)
        if inc.escalated:
            return None
        # Failed recoveries are handled for every open incident in _after_failed_recoveries.
        cls = self.classifier.classify(sig, job_step=None)
        if cls.escalated or cls.tier.rank > inc.tier.rank:
            inc.tier = cls.tier
            inc.escalated = cls.escalated
            inc.last_since = sig.since
            inc.quiet_since_plan = False
            return self._decision(DecisionType.ESCALATE, key, sig, cls, world)
        if self._recovery_did_not_hold(inc):
            # The fault went away after its plan and is back now that the plan has succeeded:
            # that recovery did not hold. It is a failed local recovery like one whose action
            # failed: planned once more, escalated when it fails again (DESIGN.md, Escalation).
            inc.last_since = sig.since
            inc.recovery_failures += 1
            return self._retry_or_escalate(world, key, inc, sig, recovery_did_not_hold=True)
        if sig.since != inc.last_since:
            # A new occurrence (another XID, a new breach run): worth recording, no new plan.
            inc.last_since = sig.since
            return IncidentDecision(
                DecisionType.UPDATE, key, sig.kind, sig.subject, inc.tier, world.now, sig
            )
        return None

    @staticmethod
    def _recovery_did_not_hold(inc: OpenIncident) -> bool:
        """The signal is back after going quiet, and the plan made before it had succeeded.

        Only a local (not heavy) recovery: a heavy plan waits for a person. A failure not yet
        answered is _after_failed_recoveries' to handle. A signal that never went quiet (a
        participant still down, whatever its ``since`` says) is not a recurrence: the plan
        never held, and counting each tick would escalate at once.
        """
        return (
            inc.plan_succeeded
            and inc.quiet_since_plan
            and inc.tier is not Tier.HEAVY
            and inc.recovery_failures <= inc.retried_failures
        )

    def _after_failed_recoveries(
        self, world: World, active: dict[str, FaultSignal]
    ) -> list[IncidentDecision]:
        """A failed local recovery is planned once more; failing again escalates (RobustRL)."""
        out = []
        for key, inc in self._open.items():
            if inc.escalated or inc.recovery_failures <= inc.retried_failures:
                continue
            sig = active.get(key) or FaultSignal(
                kind=inc.kind,
                subject=inc.subject,
                evidence=_no_evidence(inc),
                suggested_tier=inc.tier,
                detected_at=world.now,
                since=inc.last_since,
            )
            out.append(self._retry_or_escalate(world, key, inc, sig))
        return out

    def _retry_or_escalate(
        self,
        world: World,
        key: str,
        inc: OpenIncident,
        sig: FaultSignal,
        *,
        recovery_did_not_hold: bool = False,
    ) -> IncidentDecision:
        """Answer ``inc.recovery_failures`` failed local recoveries: the local plan once more,
        or, at ``escalation.local_recovery_failures``, the escalation plan."""
        cls = self.classifier.classify(sig, job_step=None, recovery_failures=inc.recovery_failures)
        inc.retried_failures = inc.recovery_failures
        inc.plan_succeeded = inc.quiet_since_plan = False  # a new plan starts now
        why: tuple[str, ...] = ()
        if recovery_did_not_hold:
            why = (f"{sig.kind.value} came back after its recovery succeeded",)
        if cls.escalated or inc.recovery_failures >= self.policy.escalation.local_recovery_failures:
            inc.tier, inc.escalated = cls.tier, True
            cls = Classification(cls.tier, cls.actions, True, why + cls.reasons)
            type_ = DecisionType.ESCALATE
        else:
            tried = f"local recovery failed {inc.recovery_failures} time(s); trying again"
            cls = Classification(inc.tier, cls.actions, False, (*why, tried))
            type_ = DecisionType.RETRY
        d = self._decision(type_, key, sig, cls, world)
        if recovery_did_not_hold:
            d = replace(d, recovery_did_not_hold=True)
        return d

    def _resolve_quiet(self, now: float, active: dict[str, FaultSignal]) -> list[IncidentDecision]:
        quiet = self.policy.incidents.quiet_period_seconds
        out = []
        for key, inc in list(self._open.items()):
            if key in active or now - inc.last_active < quiet:
                continue
            if inc.tier is Tier.HEAVY:
                # A heavy incident waits for its approver; it is closed by the service, not by
                # the signal going away (the job stays in SAFE_MODE until someone decides).
                continue
            del self._open[key]
            out.append(
                IncidentDecision(
                    DecisionType.RESOLVE, key, inc.kind, inc.subject, inc.tier, now, None
                )
            )
        return out

    def _decision(
        self, type_: DecisionType, key: str, sig: FaultSignal, cls: Classification, world: World
    ) -> IncidentDecision:
        actions = choose_actions(policy=self.policy, classification=cls, signal=sig, world=world)
        return IncidentDecision(
            type_, key, sig.kind, sig.subject, cls.tier, world.now, sig, tuple(actions), cls.reasons
        )

    @staticmethod
    def _job_step(world: World, sig: FaultSignal) -> int | None:
        if sig.subject.job is not None:
            return world.job_step(sig.subject.job)
        if sig.subject.node is not None:
            steps = [
                s
                for j in world.jobs_on_node(sig.subject.node)
                if (s := world.job_step(j)) is not None
            ]
            return min(steps) if steps else None
        return None


def _gpu_count(world: World) -> Callable[[str], int]:
    """How many GPUs a node reports: the agent sends ``gpu_lost`` (0 or 1) for each of them,
    lost ones included (0: unknown)."""

    def count(node: str) -> int:
        return max(
            world.series_count(m.GPU_LOST, node), world.series_count(m.GPU_UTILIZATION_RATIO, node)
        )

    return count


def _build_index(detectors: list[Detector]) -> LatestIndex:
    """One snapshot index for all detectors; a name two detectors filter differently comes whole."""
    names: set[str] = set()
    filters: dict[str, object] = {}
    whole: set[str] = set()
    for d in detectors:
        for name in d.metrics:
            names.add(name)
            f = d.filters.get(name)
            if f is None:
                whole.add(name)
            elif name in filters and filters[name] != f:
                whole.add(name)
            else:
                filters[name] = f
    lookups = {n for d in detectors for n in d.lookups} - names
    merged = {n: f for n, f in filters.items() if n not in whole}
    merged.update(dict.fromkeys(lookups))  # None: on demand only
    return LatestIndex(names | lookups, filters=merged)


def _no_evidence(inc: OpenIncident) -> Evidence:
    return Evidence(metric=None, detail=f"local recovery failed {inc.recovery_failures} times")
