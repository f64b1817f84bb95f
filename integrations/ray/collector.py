"""The Ray collector: the job's actors as participants, with Ray's own word on their deaths.

A thread reads the state API every ``interval`` seconds (each call bounded by ``timeout``) and
keeps the newest snapshot; the agent's round takes it without waiting. Each mapped actor is a
participant whose phase says what Ray says:

* ``ALIVE`` -> ``RUNNING``; not yet created -> ``STARTING``;
* ``RESTARTING`` -> ``RAY_RESTARTING`` and ``DEAD`` -> ``RAY_DEAD``: the policy engine treats
  both as lost at once, like a launcher's ``EXITED`` (``detection.heartbeat.exited_phases``),
  and the evidence names Ray's death cause, sent as ``ray_actor_dead{reason=...}`` (value: the
  dead process's pid);
* actors of a Ray job that finished (``SUCCEEDED``/``STOPPED``) or ended on purpose
  (``OUT_OF_SCOPE``, ``REF_DELETED``, ``RAY_KILL``) -> ``DONE``: their end is not a fault.

Ray nodes are sent as ``ray_node_alive{ray_node=IP, job}`` (one series per job with actors on
the node; 0 once Ray declared it dead: ``node_unavailable`` on the server). When Ray does not answer, the collector
says so once in the log and in ``ray_collector_up`` = 0, sends no participant from an old
snapshot, and keeps trying: the agent goes on with its other collectors.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from integrations.ray.mapping import MappedActor, map_actors
from integrations.ray.presets import Preset
from integrations.ray.state import ClusterSnapshot, RayStateReader, RayUnavailable
from recovery.protocol.samples import ParticipantReport, Sample, make_sample

log = logging.getLogger("rlguard.agent.ray")

PHASE_RUNNING = "RUNNING"
PHASE_STARTING = "STARTING"
PHASE_RESTARTING = "RAY_RESTARTING"
PHASE_DEAD = "RAY_DEAD"
PHASE_DONE = "DONE"

_FINISHED_JOB = frozenset({"SUCCEEDED", "STOPPED"})
# Ended on purpose: out of scope, or ray.kill(no_restart=True) by the framework or a person (the
# Ray hook kills with no_restart=False and refuses an actor with no restart left).
_RELEASED = frozenset({"OUT_OF_SCOPE", "REF_DELETED", "RAY_KILL"})


def actor_phase(mapped: MappedActor, finished_jobs: frozenset[str]) -> str:
    """The participant phase of one mapped actor (module docstring)."""
    actor = mapped.actor
    if actor.job_id in finished_jobs or (actor.state == "DEAD" and actor.death_reason in _RELEASED):
        return PHASE_DONE
    if actor.state == "ALIVE":
        return PHASE_RUNNING
    if actor.state == "RESTARTING":
        return PHASE_RESTARTING
    if actor.state == "DEAD":
        return PHASE_DEAD
    return PHASE_STARTING


class RayCollector:
    """Participants and samples from a Ray cluster for the node agent (module docstring)."""

    def __init__(
        self,
        preset: Preset,
        *,
        address: str = "auto",
        job_name: str | None = None,
        interval: float = 1.0,
        timeout: float = 2.0,
        reader: Callable[[], ClusterSnapshot] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.preset = preset
        self.address = address
        self.job_name = job_name
        self.interval = min(max(interval, 0.2), 60.0)
        self._read = reader or RayStateReader(address, timeout=timeout).snapshot
        self._clock = clock
        self._lock = threading.Lock()
        self._latest: tuple[float, ClusterSnapshot] | None = None
        self._error: str | None = None
        self._warned_classes: set[str] = set()
        self._lost_logged: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # An old snapshot is not sent as participants: silence is then the truthful signal.
        self.max_age = max(5.0, 3 * self.interval + timeout)

    # -- the polling thread ------------------------------------------------------------------

    def start(self) -> None:
        """Poll in a daemon thread until :meth:`close`."""
        self._thread = threading.Thread(target=self._loop, name="rlguard-ray", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.poll_once()
            self._stop.wait(self.interval)

    def poll_once(self) -> bool:
        """Read the cluster once; False (logged once per distinct error) when Ray did not answer."""
        try:
            snapshot = self._read()
        except RayUnavailable as exc:
            if str(exc) != self._error:
                log.warning("%s; retrying every %.1f s", exc, self.interval)
            with self._lock:
                self._error = str(exc)
            return False
        with self._lock:
            if self._error is not None:
                log.info("Ray at %s answers again", self.address)
            self._error = None
            self._latest = (self._clock(), snapshot)
        return True

    @property
    def error(self) -> str | None:
        """The last failure to read Ray, None while it answers."""
        with self._lock:
            return self._error

    # -- the agent's round -------------------------------------------------------------------

    def collect(self) -> tuple[list[Sample], list[ParticipantReport]]:
        """This round's samples and participants from the newest snapshot (never blocks on Ray)."""
        now = self._clock()
        with self._lock:
            latest, error = self._latest, self._error
        if latest is None and error is None:
            # The first read has not finished (importing Ray's state API alone takes seconds on
            # a busy node): whether Ray answers is not known yet, so nothing is said of it. A 1
            # here once claimed a Ray that never answered was up.
            return [], []
        samples: list[Sample] = [make_sample("ray_collector_up", 0 if error else 1, now, {})]
        if latest is None or now - latest[0] > self.max_age:
            return samples, []
        return self.from_snapshot(latest[1], now, samples)

    def from_snapshot(
        self, snapshot: ClusterSnapshot, now: float, samples: list[Sample] | None = None
    ) -> tuple[list[Sample], list[ParticipantReport]]:
        """Samples and participants for one snapshot (the benchmark measures this)."""
        samples = samples if samples is not None else []
        finished = frozenset(
            j.job_id for j in snapshot.jobs if j.job_id and j.status in _FINISHED_JOB
        )
        mapped = map_actors(snapshot.actors, self.preset, snapshot.jobs, job_name=self.job_name)
        for class_name in mapped.unmatched - self._warned_classes:
            self._warned_classes.add(class_name)
            log.warning(
                "Ray actor class %r matches no role of preset %r: not watched (add a rule with "
                "--ray-preset FILE)",
                class_name,
                self.preset.name,
            )
        participants: list[ParticipantReport] = []
        for m in mapped.actors:
            phase = actor_phase(m, finished)
            labels = {"job": m.job, "role": m.role, "rank": str(m.rank)}
            participants.append(ParticipantReport(m.job, m.role, m.rank, phase, 0, now))
            samples.append(
                make_sample("ray_actor_alive", 1 if phase == PHASE_RUNNING else 0, now, labels)
            )
            samples.append(
                make_sample("ray_actor_restarts_total", m.actor.num_restarts, now, labels)
            )
            if phase in (PHASE_DEAD, PHASE_RESTARTING):
                reason = m.actor.death_reason or "UNKNOWN"
                samples.append(
                    make_sample(
                        "ray_actor_dead", m.actor.pid or 0, now, {**labels, "reason": reason}
                    )
                )
                self._log_loss(m, phase)
        jobs_on_node: dict[str, set[str]] = {}
        for m in mapped.actors:
            if m.actor.node_id:
                jobs_on_node.setdefault(m.actor.node_id, set()).add(m.job)
        for node in snapshot.nodes:
            alive = 1 if node.state == "ALIVE" else 0
            name = node.node_ip or node.node_id[:12]
            # one series per job with actors there: a dead node is then lost for those jobs
            jobs: list[str | None] = [*sorted(jobs_on_node.get(node.node_id, ()))] or [None]
            for job in jobs:
                labels = {"ray_node": name} if job is None else {"ray_node": name, "job": job}
                samples.append(make_sample("ray_node_alive", alive, now, labels))
        return samples, participants

    def _log_loss(self, m: MappedActor, phase: str) -> None:
        actor = m.actor
        if self._lost_logged.get(actor.actor_id) == actor.num_restarts:
            return
        self._lost_logged[actor.actor_id] = actor.num_restarts
        log.warning(
            "Ray actor %s (%s %s-%d of job %s, pid %s) is %s: %s: %s",
            actor.actor_id,
            actor.class_name,
            m.role,
            m.rank,
            m.job,
            actor.pid,
            actor.state,
            actor.death_reason,
            (actor.death_message or "")[:500],
        )
