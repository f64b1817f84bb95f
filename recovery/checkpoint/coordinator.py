"""The checkpoint coordinator: heartbeats, failure detection, checkpoint rounds, leadership.

One coordinator per job leads (it holds a :class:`~recovery.checkpoint.lease.Lease` in Redis or
PostgreSQL); standbys run the same code and take over when the lease expires. The leader's rounds:

1. *prepare*: every participant finishes its atomic step, freezes weight writes and answers
   ready with its version vector (trainers first; a rollout once it serves their final weights);
   the target is the trainer ranks' vector (they must agree), and with
   ``require_sync_boundary`` every rollout must already serve the trainer's weight version;
2. *commit*: every participant saves what it owns and answers done;
3. the new global version is published through the lease (fenced by the epoch), then everyone
   is told to resume.

A participant that does not answer within ``round_timeout``, answers "not ready", fails its save
or cannot be reached aborts the round: everyone resumes and the global version does not move.
Rounds start every ``checkpoint_interval_steps`` trainer steps, every
``checkpoint_interval_seconds``, or on request (:meth:`request_round`). HTTP API: ``POST
/v1/heartbeat``, ``POST /v1/rounds`` (a round on request), ``GET /v1/status``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from recovery.checkpoint import _http
from recovery.checkpoint._http import ProtocolInputError
from recovery.checkpoint._http import field as body_field
from recovery.checkpoint._round_log import AbortStreak
from recovery.checkpoint.detector import FailureDetector, Health, HealthChange
from recovery.checkpoint.errors import CheckpointInputError, CoordinatorError, LeaseError
from recovery.checkpoint.lease import Lease
from recovery.checkpoint.participant import ROLES, STATES, Participant, RoundResult
from recovery.checkpoint.version import VersionVector, staleness
from recovery.errors import RecoveryError

__all__ = ["Coordinator", "Participant", "ParticipantView", "RoundOutcome", "RoundResult"]

log = logging.getLogger("rlguard.recovery.coordinator")


@dataclass
class ParticipantView:
    """What the coordinator knows about one participant from its heartbeats."""

    name: str
    role: str
    state: str
    version: VersionVector
    url: str


@dataclass(frozen=True)
class RoundOutcome:
    """The result of one checkpoint round."""

    round_id: int
    committed: bool
    global_version: VersionVector | None
    reason: str
    members: tuple[str, ...]
    saved: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """Status-page form."""
        return {
            "round_id": self.round_id,
            "committed": self.committed,
            "global_version": None
            if self.global_version is None
            else self.global_version.as_json(),
            "reason": self.reason,
            "members": list(self.members),
        }


class _Abort(CoordinatorError):
    """Raised inside a round to abort it with a reason."""


class Coordinator:
    """Leader-elected checkpoint coordinator serving the protocol on ``host:port``."""

    def __init__(
        self,
        *,
        coordinator_id: str,
        lease: Lease,
        host: str = "127.0.0.1",
        port: int = 0,
        expected: Collection[str] = (),
        round_timeout: float = 30.0,
        request_timeout: float = 2.0,
        suspect_after: float = 15.0,
        confirm_after: float = 60.0,
        checkpoint_interval_steps: int | None = 50,
        checkpoint_interval_seconds: float | None = None,
        max_staleness: int = 5,
        require_sync_boundary: bool = True,
        tick: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
        on_health_change: Callable[[HealthChange], None] | None = None,
        on_round: Callable[[RoundOutcome], None] | None = None,
    ) -> None:
        if not coordinator_id:
            raise CheckpointInputError("coordinator_id must be a non-empty string")
        if not round_timeout > 0 or not request_timeout > 0 or not tick > 0:
            raise CheckpointInputError(
                f"round_timeout, request_timeout and tick must be > 0, got "
                f"{round_timeout!r}, {request_timeout!r}, {tick!r}"
            )
        if checkpoint_interval_steps is not None and checkpoint_interval_steps < 1:
            raise CheckpointInputError(
                f"checkpoint_interval_steps must be >= 1 or None, got {checkpoint_interval_steps!r}"
            )
        if checkpoint_interval_seconds is not None and not checkpoint_interval_seconds > 0:
            raise CheckpointInputError(
                f"checkpoint_interval_seconds must be > 0 or None, got {checkpoint_interval_seconds!r}"
            )
        if max_staleness < 0:
            raise CheckpointInputError(f"max_staleness must be >= 0, got {max_staleness!r}")
        self.coordinator_id = coordinator_id
        self.lease = lease
        self.expected = tuple(expected)
        self.round_timeout = round_timeout
        self.request_timeout = request_timeout
        self.checkpoint_interval_steps = checkpoint_interval_steps
        self.checkpoint_interval_seconds = checkpoint_interval_seconds
        self.max_staleness = max_staleness
        self.require_sync_boundary = require_sync_boundary
        self.tick = tick
        self._clock = clock
        self._aborts = AbortStreak(log, clock)
        self._on_health_change = on_health_change
        self._on_round = on_round
        self.detector = FailureDetector(
            suspect_after=suspect_after, confirm_after=confirm_after, clock=clock
        )
        self._lock = threading.Lock()
        self._round_lock = threading.Lock()
        self._views: dict[str, ParticipantView] = {}
        self._leader = False
        self._epoch = 0
        self._global: VersionVector | None = None
        self._last_round_id = 0
        self._last_outcome: RoundOutcome | None = None
        self._last_round_at = clock()
        self._retry_after = 0.0
        self._requested: str | None = None
        self._stop = threading.Event()
        self._server = self._protocol_server(host, port)
        self.url = self._server.url
        self._threads = [
            threading.Thread(target=self._lease_loop, name="rlguard-coord-lease", daemon=True),
            threading.Thread(target=self._schedule_loop, name="rlguard-coord-sched", daemon=True),
        ]

    def _protocol_server(self, host: str, port: int) -> _http.JsonServer:
        """The HTTP server of the protocol (started by :meth:`start`)."""
        routes: dict[str, _http.Route] = {
            "POST /v1/heartbeat": self._handle_heartbeat,
            "POST /v1/rounds": self._handle_round_request,
            "GET /v1/status": lambda _body: (200, self.status()),
        }
        return _http.JsonServer(
            host, port, routes, name=f"rlguard-coordinator-{self.coordinator_id}"
        )

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Serve the protocol and start competing for leadership."""
        self._server.start()
        for t in self._threads:
            t.start()

    def close(self, *, release: bool = True) -> None:
        """Stop; with ``release`` the lease is handed back so a standby takes over at once."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self.round_timeout + 5)
        if release and self.is_leader:
            try:
                self.lease.release(self.coordinator_id)
            except LeaseError as exc:
                log.warning("could not release the lease: %s", exc)
        with self._lock:
            self._leader = False
        self._server.close()

    @property
    def is_leader(self) -> bool:
        """True while this coordinator holds the lease."""
        with self._lock:
            return self._leader

    @property
    def global_version(self) -> VersionVector | None:
        """The version of the last committed round (None before the first)."""
        with self._lock:
            return self._global

    @property
    def last_outcome(self) -> RoundOutcome | None:
        """The outcome of the last round this coordinator ran."""
        with self._lock:
            return self._last_outcome

    # ---- leadership ---------------------------------------------------------------------------

    def _lease_loop(self) -> None:
        interval = max(0.05, min(self.lease.ttl / 3, 2.0))
        while not self._stop.is_set():
            try:
                if self.is_leader:
                    if not self.lease.renew(self.coordinator_id):
                        self._step_down("lease renewal refused (another coordinator holds it)")
                else:
                    grant = self.lease.try_acquire(self.coordinator_id)
                    if grant is not None:
                        self._take_over(grant.epoch)
            except LeaseError as exc:
                # We cannot prove we still hold the lease, so we must not act as leader.
                if self.is_leader:
                    self._step_down(f"lease backend unreachable: {exc}")
                else:
                    log.warning("%s: lease backend unreachable: %s", self.coordinator_id, exc)
            except Exception:  # keep competing for the lease whatever happened; logged loudly
                log.exception("%s: lease loop iteration failed", self.coordinator_id)
            self._stop.wait(interval)

    def _step_down(self, reason: str) -> None:
        log.warning("%s: stepping down: %s", self.coordinator_id, reason)
        with self._lock:
            self._leader = False

    def _take_over(self, epoch: int) -> None:
        state = self.lease.read_state() or {}
        gv = state.get("global_version")
        try:
            restored = VersionVector.from_json(gv) if gv is not None else None
            last_round = int(state.get("last_round_id", 0))
        except (RecoveryError, TypeError, ValueError) as exc:
            # Leading without the old state beats nobody leading; restore() still finds the
            # newest valid checkpoint on disk.
            log.error("%s: published state unreadable (%r): %s", self.coordinator_id, state, exc)
            restored, last_round = None, 0
        with self._lock:
            self._epoch = epoch
            self._global = restored
            self._last_round_id = max(self._last_round_id, last_round)
            self._last_round_at = self._clock()
            self._leader = True
            members = list(self._views.values())
        log.warning(
            "%s: became leader (epoch %s, global version %s)", self.coordinator_id, epoch, gv
        )
        # A round the previous leader left open keeps its participants frozen: release them.
        self._broadcast_finish(members, None, committed=False, reason="leader changed")

    # ---- HTTP handlers ------------------------------------------------------------------------

    def _handle_heartbeat(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        name = body_field(body, "name", str)
        role = body_field(body, "role", str)
        state = body_field(body, "state", str)
        url = body_field(body, "callback_url", str)
        if not name:
            raise ProtocolInputError("field 'name' must not be empty")
        if role not in ROLES:
            raise ProtocolInputError(f"field 'role' must be one of {ROLES}, got {role!r}")
        if state not in STATES:
            raise ProtocolInputError(f"field 'state' must be one of {STATES}, got {state!r}")
        if not url.startswith("http://"):
            raise ProtocolInputError(f"field 'callback_url' must be an http:// URL, got {url!r}")
        version = VersionVector.from_json(body_field(body, "version", dict))
        with self._lock:
            self._views[name] = ParticipantView(name, role, state, version, url)
        change = self.detector.beat(name)
        if change is not None:
            self._report(change)
        with self._lock:
            must_wait, lag = self._staleness_locked(name)
            return 200, {
                "leader": self._leader,
                "coordinator_id": self.coordinator_id,
                "epoch": self._epoch,
                "global_version": None if self._global is None else self._global.as_json(),
                "must_wait": must_wait,
                "staleness": lag,
            }

    def _staleness_locked(self, name: str) -> tuple[bool, int]:
        view = self._views[name]
        if view.role != "trainer":
            return False, 0
        rollout_steps = [
            v.version.training_step
            for v in self._views.values()
            if v.role == "rollout" and self.detector.health(v.name) is not Health.FAILED
        ]
        lag = staleness(view.version.training_step, rollout_steps)
        return lag > self.max_staleness, lag

    def _handle_round_request(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        reason = body.get("reason", "requested")
        if not isinstance(reason, str):
            raise ProtocolInputError(f"field 'reason' must be a string, got {reason!r}")
        if not self.is_leader:
            return 409, {"error": f"{self.coordinator_id} is not the leader"}
        self.request_round(reason)
        return 202, {"requested": True}

    def status(self) -> dict[str, Any]:
        """Everything the coordinator knows, as JSON (also ``GET /v1/status``)."""
        with self._lock:
            views = list(self._views.values())
            out: dict[str, Any] = {
                "coordinator_id": self.coordinator_id,
                "leader": self._leader,
                "epoch": self._epoch,
                "global_version": None if self._global is None else self._global.as_json(),
                "last_round_id": self._last_round_id,
                "last_round": None if self._last_outcome is None else self._last_outcome.as_json(),
            }
        out["participants"] = {
            v.name: {
                "role": v.role,
                "state": v.state,
                "version": v.version.as_json(),
                "health": (self.detector.health(v.name) or Health.ALIVE).value,
                "silent_for": self.detector.silent_for(v.name),
            }
            for v in views
        }
        return out

    # ---- scheduling ---------------------------------------------------------------------------

    def request_round(self, reason: str = "requested") -> None:
        """Ask for a round at the next tick (ignored unless this coordinator is the leader)."""
        with self._lock:
            self._requested = reason

    def _report(self, change: HealthChange) -> None:
        log.warning(
            "participant %s: %s -> %s (silent %.1f s)",
            change.name,
            change.old.value,
            change.new.value,
            change.silent_for,
        )
        if self._on_health_change is not None:
            try:
                self._on_health_change(change)
            except Exception:  # the caller's callback must not break heartbeats; logged loudly
                log.exception("on_health_change callback failed for %s", change)

    def _due_reason(self) -> str | None:
        now = self._clock()
        with self._lock:
            if self._requested is not None:
                reason, self._requested = self._requested, None
                return reason
            if now < self._retry_after:
                return None
            base = self._global.training_step if self._global is not None else 0
            trainer_steps = [
                v.version.training_step for v in self._views.values() if v.role == "trainer"
            ]
            if (
                self.checkpoint_interval_steps is not None
                and trainer_steps
                and max(trainer_steps) >= base + self.checkpoint_interval_steps
            ):
                return f"step interval ({self.checkpoint_interval_steps})"
            if (
                self.checkpoint_interval_seconds is not None
                and now - self._last_round_at >= self.checkpoint_interval_seconds
            ):
                return f"time interval ({self.checkpoint_interval_seconds} s)"
        return None

    def _schedule_loop(self) -> None:
        while not self._stop.is_set():
            try:
                for change in self.detector.evaluate():
                    self._report(change)
                if self.is_leader:
                    reason = self._due_reason()
                    if reason is not None:
                        self.run_round(reason)
            except Exception:  # a callback's bug must not stop failure detection; logged loudly
                log.exception("%s: scheduler tick failed", self.coordinator_id)
            self._stop.wait(self.tick)

    # ---- the round ----------------------------------------------------------------------------

    def run_round(self, reason: str = "requested") -> RoundOutcome:
        """Run one prepare → commit round now (blocking, at most about 2 × ``round_timeout``)."""
        with self._round_lock:
            with self._lock:
                if not self._leader:
                    raise CoordinatorError(f"{self.coordinator_id} is not the leader")
                self._last_round_id += 1
                round_id = self._last_round_id
                epoch = self._epoch
                members = [
                    v
                    for v in self._views.values()
                    if self.detector.health(v.name) is not Health.FAILED
                ]
                previous = self._global
            names = tuple(sorted(v.name for v in members))
            log.info("round %s (%s) starts with %s", round_id, reason, names)
            try:
                missing = [n for n in self.expected if n not in names]
                if missing:
                    raise _Abort(f"expected participants not available: {missing}")
                if not members:
                    raise _Abort("no participants")
                prepare = {"round_id": round_id, "epoch": epoch}
                trainers = [v for v in members if v.role == "trainer"]
                others = [v for v in members if v.role != "trainer"]
                if trainers and others:
                    # Freeze the trainers first: their weight version is then final, and the
                    # rollouts may keep pulling until they serve it before they freeze too, so
                    # the round lands on a sync boundary instead of aborting on a lagging pull.
                    ready = self._phase(trainers, "/v1/prepare", prepare, "ready")
                    weights = self._target_version(trainers, ready).inference_version
                    ready |= self._phase(
                        others,
                        "/v1/prepare",
                        {**prepare, "min_inference_version": weights},
                        "ready",
                    )
                else:
                    ready = self._phase(members, "/v1/prepare", prepare, "ready")
                target = self._target_version(members, ready)
                done = self._phase(
                    members,
                    "/v1/commit",
                    {"round_id": round_id, "epoch": epoch, "target_version": target.as_json()},
                    "done",
                )
                published = self.lease.publish(
                    self.coordinator_id,
                    {"global_version": target.as_json(), "last_round_id": round_id, "epoch": epoch},
                )
                if not published:
                    self._step_down("publishing the round's version was refused")
                    raise _Abort("lost the lease before the global version could be published")
            except RecoveryError as exc:  # _Abort, lease trouble, a malformed answer
                outcome = RoundOutcome(round_id, False, previous, str(exc), names)
                self._aborts.aborted(round_id, exc)
                self._broadcast_finish(members, round_id, committed=False, reason=str(exc))
                self._publish_round_id(round_id)
                with self._lock:
                    self._last_outcome = outcome
                    self._retry_after = self._clock() + self.round_timeout
            else:
                saved = {n: a.get("saved") for n, a in done.items() if a.get("saved") is not None}
                outcome = RoundOutcome(round_id, True, target, reason, names, saved)
                with self._lock:
                    self._global = target
                    self._last_outcome = outcome
                    self._last_round_at = self._clock()
                self._aborts.committed(round_id, target)
                self._broadcast_finish(
                    members, round_id, committed=True, reason=reason, version=target
                )
        if self._on_round is not None:
            self._on_round(outcome)
        return outcome

    def _phase(
        self, members: list[ParticipantView], path: str, body: dict[str, Any], flag: str
    ) -> dict[str, dict[str, Any]]:
        """Send one phase to everyone in parallel; abort on the first missing ``flag``."""
        body = {**body, "wait": self.round_timeout}

        def one(view: ParticipantView) -> dict[str, Any]:
            # The participant answers within ``wait``; the extra second covers the network.
            return _http.call(view.url, path, body, timeout=self.round_timeout + 1.0)

        answers: dict[str, dict[str, Any]] = {}
        with ThreadPoolExecutor(max_workers=len(members)) as pool:
            futures = {v.name: pool.submit(one, v) for v in members}
            problems = []
            for name, fut in futures.items():
                try:
                    answer = fut.result()
                except RecoveryError as exc:
                    problems.append(f"{name}: {exc}")
                    continue
                if not answer.get(flag):
                    problems.append(f"{name}: {answer.get('reason', f'not {flag}')}")
                answers[name] = answer
        if problems:
            raise _Abort(f"{path.rsplit('/', 1)[-1]} failed: " + "; ".join(sorted(problems)))
        return answers

    def _target_version(
        self, members: list[ParticipantView], ready: dict[str, dict[str, Any]]
    ) -> VersionVector:
        versions = {n: VersionVector.from_json(a.get("version")) for n, a in ready.items()}
        roles = {v.name: v.role for v in members}
        trainers = [versions[n] for n in versions if roles[n] == "trainer"]
        rollouts = {n: versions[n] for n in versions if roles[n] == "rollout"}
        if trainers:
            if len(set(trainers)) > 1:
                # Data-parallel ranks step together; ranks that disagree are not at one point.
                seen = sorted({(v.training_step, v.inference_version) for v in trainers})
                raise _Abort(f"trainer ranks disagree on their version: {seen}")
            step = trainers[0].training_step
            weights = trainers[0].inference_version
        else:
            step = max(v.training_step for v in versions.values())
            weights = max(v.inference_version for v in versions.values())
        if self.require_sync_boundary:
            lagging = sorted(n for n, v in rollouts.items() if v.inference_version != weights)
            if lagging:
                raise _Abort(
                    f"not at a sync boundary: {lagging} do not serve weight version {weights}"
                )
        return VersionVector(step, weights)

    def _broadcast_finish(
        self,
        members: list[ParticipantView],
        round_id: int | None,
        *,
        committed: bool,
        reason: str,
        version: VersionVector | None = None,
    ) -> None:
        with self._lock:
            epoch = self._epoch
        body = {
            "round_id": round_id,
            "epoch": epoch,
            "committed": committed,
            "reason": reason,
            "global_version": None if version is None else version.as_json(),
        }

        def one(view: ParticipantView) -> None:
            try:
                _http.call(view.url, "/v1/finish", body, timeout=self.request_timeout)
            except RecoveryError as exc:
                # A participant we cannot tell resumes on its own when its safe_point times out.
                log.warning("finish to %s failed: %s", view.name, exc)

        if members:
            with ThreadPoolExecutor(max_workers=len(members)) as pool:
                list(pool.map(one, members))

    def _publish_round_id(self, round_id: int) -> None:
        with self._lock:
            gv = self._global
            epoch = self._epoch
        state = {
            "global_version": None if gv is None else gv.as_json(),
            "last_round_id": round_id,
            "epoch": epoch,
        }
        try:
            self.lease.publish(self.coordinator_id, state)
        except LeaseError as exc:
            log.warning("could not publish round id %s: %s", round_id, exc)

    def adopt_global_version(self, version: VersionVector) -> None:
        """Set and publish the global version after a restore (leader only)."""
        with self._lock:
            if not self._leader:
                raise CoordinatorError(f"{self.coordinator_id} is not the leader")
            round_id, epoch = self._last_round_id, self._epoch
        state = {"global_version": version.as_json(), "last_round_id": round_id, "epoch": epoch}
        if not self.lease.publish(self.coordinator_id, state):
            self._step_down("publishing the restored version was refused")
            raise CoordinatorError("lost the lease while adopting the restored version")
        with self._lock:
            self._global = version
