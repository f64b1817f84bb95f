"""The participant side of the checkpoint protocol (trainer, rollout/inference, buffer).

A participant heartbeats its local version vector and state to every configured coordinator
(leader and standbys, so a standby already knows everyone when it takes over), and serves three
commands from the leader over HTTP:

``POST /v1/prepare``  wait (up to the coordinator's ``wait``) until the training loop reaches a
                      safe point (with ``min_inference_version``: one at which it serves at
                      least that weight version), then answer ready with the local version;
``POST /v1/commit``   let the loop run its save callback, answer done;
``POST /v1/finish``   the round's outcome (committed with the new global version, or aborted):
                      the loop resumes.

The training loop calls :meth:`Participant.safe_point` between atomic steps (after an optimizer
step, after a rollout batch). That is the only place weights are frozen, so a round can never
catch a participant in the middle of a step. Commands carry the leader's lease epoch; commands
from an older epoch (a deposed leader) are refused.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from recovery.checkpoint import _http
from recovery.checkpoint._http import ProtocolInputError, field
from recovery.checkpoint.errors import CheckpointInputError, CoordinatorError
from recovery.checkpoint.version import VersionVector
from recovery.errors import RecoveryError, RecoveryTimeout

log = logging.getLogger("rlguard.recovery.participant")

ROLES = ("trainer", "rollout", "buffer")
STATES = ("idle", "training", "syncing", "rollout_in_progress", "ready", "saving")
CommitCallback = Callable[[int, VersionVector], dict[str, Any] | None]


@dataclass(frozen=True)
class RoundResult:
    """What a round meant for this participant."""

    round_id: int
    committed: bool
    global_version: VersionVector | None
    reason: str = ""
    saved: dict[str, Any] | None = None


class _Round:
    """One round as seen by a participant; every field change notifies ``cond``."""

    def __init__(self, round_id: int, epoch: int, min_inference_version: int | None) -> None:
        self.id = round_id
        self.epoch = epoch
        self.min_inference_version = min_inference_version
        self.cond = threading.Condition()
        self.ready_version: VersionVector | None = None
        self.target: VersionVector | None = None
        self.saved: dict[str, Any] | None = None
        self.save_error: str | None = None
        self.done = False
        self.outcome: tuple[bool, VersionVector | None, str] | None = None

    def finish(self, committed: bool, version: VersionVector | None, reason: str) -> None:
        with self.cond:
            if self.outcome is None:
                self.outcome = (committed, version, reason)
            self.cond.notify_all()


class Participant:
    """One process's link to the checkpoint coordinator.

    ``on_commit(round_id, target_version)`` runs in the training loop's thread inside
    :meth:`safe_point` when the round commits; it saves what this participant owns (the trainer
    calls ``CheckpointEngine.save(...).wait()``) and may return a small JSON-able summary.
    """

    def __init__(
        self,
        name: str,
        role: str,
        coordinator_urls: Sequence[str],
        *,
        version: VersionVector,
        on_commit: CommitCallback | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        heartbeat_interval: float = 5.0,
        request_timeout: float = 2.0,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise CheckpointInputError(f"participant name must be a non-empty string, got {name!r}")
        if role not in ROLES:
            raise CheckpointInputError(f"role must be one of {ROLES}, got {role!r}")
        if not coordinator_urls:
            raise CheckpointInputError("at least one coordinator URL is needed")
        if not heartbeat_interval > 0 or not request_timeout > 0:
            raise CheckpointInputError(
                f"heartbeat_interval and request_timeout must be > 0, got "
                f"{heartbeat_interval!r}, {request_timeout!r}"
            )
        self.name = name
        self.role = role
        self.coordinator_urls = list(coordinator_urls)
        self.heartbeat_interval = heartbeat_interval
        self.request_timeout = request_timeout
        self._on_commit = on_commit
        self._lock = threading.Lock()
        self._version = version
        self._state = "idle"
        self._round: _Round | None = None
        self._epoch = 0
        self._leader_url: str | None = None
        self._must_wait = False
        self._global: VersionVector | None = None
        self._stop = threading.Event()
        self._server = _http.JsonServer(
            host,
            port,
            {
                "POST /v1/prepare": self._handle_prepare,
                "POST /v1/commit": self._handle_commit,
                "POST /v1/finish": self._handle_finish,
            },
            name=f"rlguard-participant-{name}",
        )
        self.url = self._server.url
        self._beater = threading.Thread(
            target=self._heartbeat_loop, name=f"rlguard-heartbeat-{name}", daemon=True
        )

    # ---- lifecycle and local state ----------------------------------------------------------

    def start(self) -> None:
        """Start serving commands and heartbeating."""
        self._server.start()
        self._beater.start()

    def close(self) -> None:
        """Stop heartbeating and serving; an open round is abandoned (the coordinator aborts)."""
        self._stop.set()
        with self._lock:
            current = self._round
        if current is not None:
            current.finish(False, None, "participant closed")
        self._server.close()
        if self._beater.is_alive():
            self._beater.join(timeout=self.request_timeout * len(self.coordinator_urls) + 1)

    def set_version(self, version: VersionVector) -> None:
        """The version vector this participant holds now (reported in heartbeats)."""
        if not isinstance(version, VersionVector):
            raise CheckpointInputError(f"version must be a VersionVector, got {version!r}")
        with self._lock:
            self._version = version

    def set_state(self, state: str) -> None:
        """The activity this participant is in now (reported in heartbeats)."""
        if state not in STATES:
            raise CheckpointInputError(f"state must be one of {STATES}, got {state!r}")
        with self._lock:
            self._state = state

    @property
    def version(self) -> VersionVector:
        """The local version vector."""
        with self._lock:
            return self._version

    @property
    def global_version(self) -> VersionVector | None:
        """The last global version the leader announced."""
        with self._lock:
            return self._global

    @property
    def leader_url(self) -> str | None:
        """The coordinator that answered as leader most recently."""
        with self._lock:
            return self._leader_url

    @property
    def must_wait(self) -> bool:
        """True while the leader says the trainer is too far ahead of the rollout weights."""
        with self._lock:
            return self._must_wait

    @property
    def prepare_pending(self) -> bool:
        """True when a round waits for this participant to reach a safe point."""
        with self._lock:
            r = self._round
        return r is not None and r.ready_version is None and r.outcome is None

    # ---- heartbeats ---------------------------------------------------------------------------

    def heartbeat_now(self) -> bool:
        """Send one heartbeat to every coordinator; True if a leader answered."""
        with self._lock:
            body = {
                "name": self.name,
                "role": self.role,
                "state": self._state,
                "version": self._version.as_json(),
                "callback_url": self.url,
            }
        leader_seen = False
        for url in self.coordinator_urls:
            try:
                answer = _http.call(url, "/v1/heartbeat", body, timeout=self.request_timeout)
            except RecoveryError as exc:
                log.debug("%s: heartbeat to %s failed: %s", self.name, url, exc)
                continue
            if not answer.get("leader"):
                continue
            try:
                epoch = answer.get("epoch", 0)
                if isinstance(epoch, bool) or not isinstance(epoch, int):
                    raise CoordinatorError(f"epoch must be an int, got {epoch!r}")
                gv_raw = answer.get("global_version")
                gv = VersionVector.from_json(gv_raw) if gv_raw is not None else None
            except RecoveryError as exc:
                # A malformed answer must not stop the heartbeat thread; it is logged loudly.
                log.error("%s: bad heartbeat answer from %s: %s", self.name, url, exc)
                continue
            leader_seen = True
            with self._lock:
                self._leader_url = url
                self._epoch = max(self._epoch, epoch)
                self._must_wait = bool(answer.get("must_wait"))
                if gv is not None:
                    self._global = gv
        return leader_seen

    def _heartbeat_loop(self) -> None:
        while not self._stop.is_set():
            if not self.heartbeat_now():
                log.info("%s: no coordinator answered as leader", self.name)
            self._stop.wait(self.heartbeat_interval)

    def leader_status(self) -> dict[str, Any]:
        """The leader's ``GET /v1/status`` (every participant's role, state and version)."""
        url = self.leader_url
        if url is None:
            raise CoordinatorError(f"{self.name}: no leader known yet")
        return _http.call(url, "/v1/status", None, timeout=self.request_timeout)

    def wait_until_allowed(self, timeout: float, poll: float = 0.2) -> None:
        """Block while the leader says this trainer is too far ahead (staleness bound)."""
        deadline = time.monotonic() + timeout
        while True:
            self.heartbeat_now()
            if not self.must_wait:
                return
            if time.monotonic() >= deadline:
                raise RecoveryTimeout(
                    f"{self.name}: still more than the staleness bound ahead after {timeout} s"
                )
            time.sleep(poll)

    # ---- the training loop's side of a round --------------------------------------------------

    def safe_point(self, timeout: float) -> RoundResult | None:
        """Call between atomic steps. If a round is preparing, freeze here: answer ready, run the
        save callback on commit, and return once the round is finished (or ``timeout`` passes
        without word from the coordinator, which counts as an abort). Returns None at once when
        no round is pending.
        """
        with self._lock:
            r = self._round
            if r is None or r.ready_version is not None or r.outcome is not None:
                return None
            if (
                r.min_inference_version is not None
                and self._version.inference_version < r.min_inference_version
            ):
                return None  # keep going: the round waits until we serve the trainers' weights
            previous_state = self._state
            self._state = "ready"
            version = self._version
        deadline = time.monotonic() + timeout
        with r.cond:
            r.ready_version = version
            r.cond.notify_all()
            r.cond.wait_for(
                lambda: r.target is not None or r.outcome is not None,
                timeout=max(0.0, deadline - time.monotonic()),
            )
            target = r.target if r.outcome is None else None
        if target is not None:
            self.set_state("saving")
            saved: dict[str, Any] | None = None
            error: str | None = None
            try:
                if self._on_commit is not None:
                    saved = self._on_commit(r.id, target)
            except Exception as exc:  # reported to the coordinator (the round aborts) and logged
                error = f"save failed: {exc!r}"
                log.error("%s: round %s save failed: %s", self.name, r.id, exc)
            with r.cond:
                r.saved, r.save_error, r.done = saved, error, True
                r.cond.notify_all()
                r.cond.wait_for(
                    lambda: r.outcome is not None, timeout=max(0.0, deadline - time.monotonic())
                )
        r.finish(False, None, f"no word from the coordinator within {timeout} s")
        assert r.outcome is not None
        committed, gv, reason = r.outcome
        with self._lock:
            if self._round is r:
                self._round = None
            self._state = previous_state
            if committed and gv is not None:
                self._global = gv
        return RoundResult(r.id, committed, gv, reason, r.saved if committed else None)

    # ---- command handlers (HTTP threads) -------------------------------------------------------

    def _fence(self, body: dict[str, Any]) -> int:
        epoch = int(field(body, "epoch", int))
        with self._lock:
            if epoch < self._epoch:
                raise _StaleEpoch(f"command from epoch {epoch}, but epoch {self._epoch} is current")
            self._epoch = epoch
        return epoch

    def _handle_prepare(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        round_id = field(body, "round_id", int)
        wait = float(field(body, "wait", (int, float)))
        min_version = body.get("min_inference_version")
        if min_version is not None and (
            isinstance(min_version, bool) or not isinstance(min_version, int)
        ):
            raise ProtocolInputError(
                f"field 'min_inference_version' must be an int or null, got {min_version!r}"
            )
        try:
            epoch = self._fence(body)
        except _StaleEpoch as exc:
            return 409, {"error": str(exc)}
        r = _Round(round_id, epoch, min_version)
        with self._lock:
            old, self._round = self._round, r
        if old is not None:
            old.finish(False, None, f"superseded by round {round_id}")
        with r.cond:
            r.cond.wait_for(lambda: r.ready_version is not None or r.outcome is not None, wait)
            if r.ready_version is not None and r.outcome is None:
                return 200, {"ready": True, "version": r.ready_version.as_json()}
        reason = f"{self.name} reached no safe point in {wait} s"
        if min_version is not None:
            reason += f" while serving weight version >= {min_version}"
        return 200, {"ready": False, "reason": reason}

    def _handle_commit(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        round_id = field(body, "round_id", int)
        wait = float(field(body, "wait", (int, float)))
        target = VersionVector.from_json(field(body, "target_version", dict))
        try:
            self._fence(body)
        except _StaleEpoch as exc:
            return 409, {"error": str(exc)}
        with self._lock:
            r = self._round
        if r is None or r.id != round_id or r.ready_version is None:
            return 409, {"error": f"{self.name} is not ready for round {round_id}"}
        with r.cond:
            r.target = target
            r.cond.notify_all()
            r.cond.wait_for(lambda: r.done or r.outcome is not None, wait)
            if r.done and r.save_error is None:
                return 200, {"done": True, "saved": r.saved}
            reason = r.save_error or f"{self.name} did not finish saving in {wait} s"
        return 200, {"done": False, "reason": reason}

    def _handle_finish(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        round_id = body.get("round_id")
        if round_id is not None and (isinstance(round_id, bool) or not isinstance(round_id, int)):
            raise ProtocolInputError(f"field 'round_id' must be an int or null, got {round_id!r}")
        committed = field(body, "committed", bool)
        reason = str(body.get("reason", ""))
        gv_raw = body.get("global_version")
        gv = VersionVector.from_json(gv_raw) if gv_raw is not None else None
        if committed and gv is None:
            raise ProtocolInputError("a committed finish needs 'global_version'")
        try:
            self._fence(body)
        except _StaleEpoch as exc:
            return 409, {"error": str(exc)}
        with self._lock:
            r = self._round
            if committed and gv is not None:
                self._global = gv
        if r is not None and (round_id is None or r.id == round_id):
            r.finish(committed, gv, reason)
        return 200, {"ok": True}


class _StaleEpoch(CoordinatorError):
    """A command from a leader whose lease epoch is older than one already seen."""
