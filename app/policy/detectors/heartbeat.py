"""Liveness: participants whose heartbeat went silent, nodes whose agent went silent."""

from __future__ import annotations

from collections import defaultdict

from app.policy.detectors.base import Detector, StartupGrace, participant_subject
from app.policy.detectors.exit_cause import ExitCauses
from app.policy.policy_file import Policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject
from app.policy.world import ParticipantView, World
from recovery.protocol import metric_names as m

_RAY_PHASES = frozenset({"RAY_DEAD", "RAY_RESTARTING"})


class HeartbeatDetector(Detector):
    """Two-level loss: silent ``suspect_seconds`` → suspected; still silent after a further
    ``confirm_seconds`` → confirmed (a signal). A participant that comes back clears itself.

    A participant whose phase is one of ``exited_phases`` (its launcher saw the process exit)
    is lost at once: nothing is left to come back.

    Participants on a node that is silent as a whole are the node detector's business.

    A Ray actor (agent ``--ray``) that Ray reports dead or restarting comes in phase
    ``RAY_DEAD`` / ``RAY_RESTARTING`` (exited phases too); Ray's death cause, sent as
    ``ray_actor_dead{reason}``, goes into the evidence.

    A participant in its start-up grace (:class:`StartupGrace`) is not judged for silence; one
    still in a start-up phase after its grace never sent its first heartbeat: lost.
    """

    lookups = (m.RAY_ACTOR_DEAD, *ExitCauses.lookups)

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self.suspected: list[ParticipantView] = []
        self.startup = StartupGrace(policy)
        self.exit_causes = ExitCauses()
        # Participant → its heartbeat time when first seen in an exited phase: the signal's
        # ``since``, kept while it stays exited. Ray's collector re-reports a dead actor with a
        # fresh heartbeat on every poll; a ``since`` that followed it made every tick a "new
        # occurrence" (an ``updated`` event and a signal row twice a second for as long as the
        # incident waited for its approver, and an incident an operator closed reopened).
        self._exited_since: dict[tuple[str, str, int], float] = {}

    def detect(self, world: World) -> list[FaultSignal]:
        cfg = self.policy.detection.heartbeat
        out: list[FaultSignal] = []
        suspected: list[ParticipantView] = []
        exited_since, self._exited_since = self._exited_since, {}
        finished, exited_phases = cfg.finished_phases, cfg.exited_phases
        suspect = cfg.suspect_seconds
        check, silence, now = self.startup.check, world.heartbeat_silence, world.now  # per tick
        under_way, start_phases = self.startup.under_way, self.startup.phases
        for p in world.participants:
            if p.phase in finished:
                continue
            starting = check(p, now) if under_way or p.phase in start_phases else None
            if starting is StartupGrace.GRACE:
                continue
            # From its node's return when that is later: see NodeReturns.
            age = silence(p)
            exited = p.phase in exited_phases
            if age < suspect and not exited and starting is None:
                continue
            node_seen = world.node_last_seen.get(p.node)
            if node_seen is not None and world.now - node_seen >= cfg.suspect_seconds:
                continue
            if starting is StartupGrace.OVERDUE:
                out.append(self._never_reported(world, p))
                continue
            if exited:
                since = exited_since.get(p.key, p.last_heartbeat_ts)
                self._exited_since[p.key] = since
                out.append(self._exited(world, p, since))
                continue
            if age < cfg.suspect_seconds + cfg.confirm_seconds:
                suspected.append(p)
                continue
            back = world.node_back_at.get(p.node)
            returned = (
                f"; counted from its node's return {world.now - back:.0f}s ago, its last "
                f"heartbeat is {world.now - p.last_heartbeat_ts:.0f}s old"
                if back is not None and back > p.last_heartbeat_ts
                else ""
            )
            evidence = Evidence(
                metric=None,
                values=((p.last_heartbeat_ts, 0.0),),
                window_seconds=cfg.suspect_seconds + cfg.confirm_seconds,
                threshold=cfg.suspect_seconds,
                detail=f"heartbeat of {p.role}-{p.rank} silent for {age:.0f}s "
                f"(suspected at {cfg.suspect_seconds:.0f}s, confirmed after a further "
                f"{cfg.confirm_seconds:.0f}s) while its node still reports{returned}",
            )
            out.append(
                self.signal(
                    world,
                    FaultKind.HEARTBEAT_LOST,
                    participant_subject(p),
                    evidence,
                    since=p.last_heartbeat_ts if not returned else back,
                    step=p.step,
                )
            )
        self.suspected = suspected
        return out

    def _exited(self, world: World, p: ParticipantView, since: float) -> FaultSignal:
        cause = self.exit_causes.of(world, p) if p.phase not in _RAY_PHASES else None
        if cause is not None:  # its own output said why: the cause's kind, tier and plan
            return self.signal(
                world,
                cause.kind,
                ExitCauses.subject(p, cause),
                ExitCauses.evidence(world, p, cause),
                since=since,
                step=p.step,
                exited=True,
                exit_cause=cause.cause,
                line=cause.line,
                same_step_failures=self.exit_causes.same_step_failures(p, cause),
            )
        ray_cause = self._ray_cause(world, p) if p.phase.startswith("RAY_") else None
        if ray_cause is not None:
            detail = (
                f"{p.role}-{p.rank} is {p.phase.removeprefix('RAY_')} in Ray "
                f"(reported {world.now - p.last_heartbeat_ts:.0f}s ago): {ray_cause}"
            )
        else:
            detail = (
                f"{p.role}-{p.rank} exited (phase {p.phase}, reported by its launcher "
                f"{world.now - p.last_heartbeat_ts:.0f}s ago) while its node still reports"
            )
        evidence = Evidence(
            metric=None,
            values=((p.last_heartbeat_ts, 0.0),),
            window_seconds=0.0,
            threshold=None,
            detail=detail,
        )
        return self.signal(
            world,
            FaultKind.HEARTBEAT_LOST,
            participant_subject(p),
            evidence,
            since=since,
            step=p.step,
            exited=True,
        )

    def _never_reported(self, world: World, p: ParticipantView) -> FaultSignal:
        grace = self.policy.detection.startup.grace_seconds(p.role)
        started = self.startup.started_at(p)
        start = started if started is not None else world.now - grace
        evidence = Evidence(
            metric=None,
            values=((p.last_heartbeat_ts, 0.0),),
            window_seconds=grace,
            threshold=grace,
            detail=f"{p.role}-{p.rank} still in {p.phase} {world.now - start:.0f}s after it "
            f"started (start-up grace {grace:.0f}s): its first heartbeat never came",
        )
        return self.signal(
            world,
            FaultKind.HEARTBEAT_LOST,
            participant_subject(p),
            evidence,
            since=start + grace,
            step=p.step,
            never_reported=True,
        )

    @staticmethod
    def _ray_cause(world: World, p: ParticipantView) -> str | None:
        """Ray's death cause of the participant's actor (newest ``ray_actor_dead`` series)."""
        best: tuple[float, str] | None = None
        for key, point in world.all_series(m.RAY_ACTOR_DEAD):
            if (key.label(m.LABEL_JOB), key.label(m.LABEL_ROLE), key.label(m.LABEL_RANK)) != (
                p.job,
                p.role,
                str(p.rank),
            ):
                continue
            pid = f", pid {int(point.value)}" if point.value > 0 else ""
            text = f"Ray death cause {key.label('reason')}{pid}"
            if best is None or point.ts > best[0]:
                best = (point.ts, text)
        return best[1] if best is not None else "Ray gave no death cause"


class NodeSilenceDetector(Detector):
    """A node whose agent sent nothing: suspected, then confirmed; several at once → heavy."""

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self.suspected: list[str] = []

    def detect(self, world: World) -> list[FaultSignal]:
        cfg = self.policy.detection.heartbeat
        confirmed: list[tuple[str, float]] = []
        suspected: list[str] = []
        for node, seen in sorted(world.node_last_seen.items()):
            age = world.now - seen
            if age < cfg.suspect_seconds:
                continue
            if age < cfg.suspect_seconds + cfg.confirm_seconds:
                suspected.append(node)
            else:
                confirmed.append((node, seen))
        self.suspected = suspected
        if not confirmed:
            return []
        out: list[FaultSignal] = []
        lost_by_job: dict[str | None, list[tuple[str, float]]] = defaultdict(list)
        for node, seen in confirmed:
            jobs: list[str | None] = list(world.jobs_on_node(node)) or [None]
            for job in jobs:
                # A node under a maintenance window is silent on purpose: it is not one of the
                # nodes lost together (the engine drops its own node_silent; see World).
                if not world.maintenance.holds(node, job):
                    lost_by_job[job].append((node, seen))
        several = self.policy.detection.nodes.several_lost_min
        grouped_nodes: set[str] = set()
        for job, lost in sorted(lost_by_job.items(), key=lambda kv: kv[0] or ""):
            if len(lost) < several:
                continue
            nodes = sorted(n for n, _ in lost)
            grouped_nodes.update(nodes)
            # The fault exists once the n-th node is confirmed: since = the n-th latest silence.
            since = sorted(seen for _, seen in lost)[several - 1]
            evidence = Evidence(
                metric=None,
                values=tuple(sorted((seen, 0.0) for _, seen in lost)),
                window_seconds=cfg.suspect_seconds + cfg.confirm_seconds,
                threshold=float(several),
                detail=f"{len(nodes)} nodes silent: {', '.join(nodes)}",
            )
            out.append(
                self.signal(
                    world,
                    FaultKind.NODES_LOST,
                    Subject(job=job),
                    evidence,
                    since=since,
                    nodes=nodes,
                )
            )
        for node, seen in confirmed:
            if node in grouped_nodes:
                continue
            evidence = Evidence(
                metric=None,
                values=((seen, 0.0),),
                window_seconds=cfg.suspect_seconds + cfg.confirm_seconds,
                threshold=cfg.suspect_seconds,
                detail=f"node {node} sent nothing for {world.now - seen:.0f}s",
            )
            out.append(
                self.signal(
                    world,
                    FaultKind.NODE_SILENT,
                    Subject(node=node),
                    evidence,
                    since=seen,
                    jobs=world.jobs_on_node(node),
                )
            )
        return out
