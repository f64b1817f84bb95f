"""The job's engines as its router sees them: who may get requests, and bringing each engine to
the trainer's current weights before it does.

The trainer owns one :class:`EngineFleet`; its thread (``tick`` every ``poll`` seconds) follows
each rank's engine record (:mod:`workload.engines.records`) through the admission states:

* ``starting``: its host wrote a record but the engine does not answer yet;
* ``refitting``: the fleet asks it (``/collective_rpc rlguard_refit``) to pull the trainer's
  current version through :mod:`recovery.transfer`, then which version it serves;
* ``admitted``: only when that answer **equals** the trainer's version;
* ``quarantined``: a request to it failed, or its tree is gone; its in-flight requests are
  retried on the others (:mod:`workload.engines.rollouts`). A new engine for the rank starts
  over; one quarantined with its tree alive is probed after ``probation_s`` (``/health``, then a
  one-token completion) and goes back to ``refitting`` if both answer, never admitted stale.

Every change is one timeline event (``engine_quarantined``, ``engine_replaced``, ``engine_refit``,
``engine_admitted``, ``engine_readmitted``, ``engine_probation``) and a rewrite of
``engines/fleet.json``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from integrations.vllm.client import EngineClient, EngineError
from workload.engines import records
from workload.engines.records import ADMITTED, QUARANTINED, REFITTING, STARTING, EngineRecord
from workload.job import RunDir, write_json_atomic

log = logging.getLogger("rlguard.workload.engines")


class NoEngineError(RuntimeError):
    """No engine is admitted (the caller waits for one to be healed)."""


@dataclass
class EngineSlot:
    """One rollout rank's engine, as the router knows it."""

    rank: int
    state: str = STARTING
    record: EngineRecord | None = None
    client: EngineClient | None = None
    version: int | None = None  # what its worker said it serves, after the last refit
    in_flight: int = 0
    tokens: int = 0  # generated for the job, all incarnations
    since: float = field(default_factory=time.time)
    quarantined_at: float | None = None
    why: str | None = None
    disagreement: dict[str, float] = field(default_factory=dict)
    incarnations: int = 0
    skip_refits: int = 0  # chaos: admit without refitting (stale weights), this many times
    admitted_once: bool = False  # this incarnation was admitted before (later refits: per step)
    transient: bool = False  # quarantined for a failed request or refit, the tree alive
    probing: bool = False  # a probation probe is in flight
    on_probation: bool = False  # back in refitting after a probation (its admission: readmitted)

    def public(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "version": self.version,
            "url": None if self.record is None else self.record.url,
            "pids": {} if self.record is None else self.record.pids,
            "host_pid": None if self.record is None else self.record.host_pid,
            "warm": None if self.record is None else self.record.warm,
            "since": self.since,
            "why": self.why,
            "in_flight": self.in_flight,
            "tokens": self.tokens,
            "incarnations": self.incarnations,
            "disagreement": self.disagreement,
        }


class EngineFleet:
    """See the module docstring. ``refit_source(version)`` is the body of the refit request
    (registry, transport, specs) for ``version``."""

    def __init__(
        self,
        run: RunDir,
        ranks: int,
        *,
        refit_source: Callable[[int], dict[str, Any]],
        request_timeout: float = 60.0,
        refit_timeout: float = 60.0,
        poll: float = 0.1,
        probation_s: float | None = 30.0,
    ) -> None:
        if probation_s is not None and not probation_s >= 0:
            raise ValueError(
                f"probation_s must be >= 0 or None (no probation), got {probation_s!r}"
            )
        self.run = run
        self.probation_s = probation_s
        self.slots = [EngineSlot(k) for k in range(ranks)]
        self.refit_source = refit_source
        self.request_timeout = request_timeout
        self.refit_timeout = refit_timeout
        self.poll = poll
        self.target: int | None = None
        self._lock = threading.Condition()
        self._stop = threading.Event()
        self._refits: dict[int, threading.Thread] = {}
        self._thread = threading.Thread(target=self._run, name="engine-fleet", daemon=True)

    # ---- life --------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for slot in self.slots:
            if slot.client is not None:
                slot.client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the router must outlive one bad round; logged
                log.exception("engine fleet round failed")
            self._stop.wait(self.poll)

    # ---- what the trainer asks ---------------------------------------------------------------

    def set_target(self, version: int) -> None:
        """The trainer's new weight version: every engine is refit to it before it serves again."""
        with self._lock:
            self.target = version
            for slot in self.slots:
                if slot.state == ADMITTED and slot.version != version:
                    self._set(slot, REFITTING, why=f"new weights v{version}")
            self._lock.notify_all()
        self.tick()

    def wait_refit(self, timeout: float) -> bool:
        """Wait until no engine that is up still refits to the target and one is admitted;
        whether that happened within ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                busy = any(s.state == REFITTING for s in self.slots)
                if not busy and any(s.state == ADMITTED for s in self.slots):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(min(left, 0.2))

    def wait_all_admitted(self, timeout: float) -> bool:
        """Wait until every engine is admitted; whether that happened within ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not all(s.state == ADMITTED for s in self.slots):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(min(left, 0.2))
            return True

    def acquire(self, preferred: int, timeout: float) -> EngineSlot:
        """An admitted engine for a request (``preferred``'s own if admitted, else the least
        busy); waits up to ``timeout`` for one. The caller must :meth:`release` it."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                admitted = [s for s in self.slots if s.state == ADMITTED]
                if admitted:
                    own = [s for s in admitted if s.rank == preferred]
                    slot = own[0] if own else min(admitted, key=lambda s: (s.in_flight, s.rank))
                    slot.in_flight += 1
                    return slot
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NoEngineError(f"no engine admitted within {timeout:.0f} s")
                self._lock.wait(min(left, 0.2))

    def release(self, slot: EngineSlot, tokens: int = 0) -> None:
        with self._lock:
            slot.in_flight = max(0, slot.in_flight - 1)
            slot.tokens += tokens
            self._lock.notify_all()

    def quarantine(self, rank: int, why: str) -> None:
        """Stop sending to ``rank`` now (a request to it failed: transient, so on probation)."""
        with self._lock:
            slot = self.slots[rank]
            if slot.state == QUARANTINED:
                return
            slot.quarantined_at, slot.transient = time.time(), True
            self._set(slot, QUARANTINED, why=why)
            self.run.event(
                "engine_quarantined",
                rank=rank,
                why=why[:300],
                incarnation=None if slot.record is None else slot.record.incarnation,
            )

    def record_disagreement(self, by_engine: dict[int, dict[str, float]], step: int) -> None:
        with self._lock:
            for rank, values in by_engine.items():
                if 0 <= rank < len(self.slots):
                    slot = self.slots[rank]
                    # which incarnation sampled it: a replacement does not inherit the figure
                    slot.disagreement = {
                        **values,
                        "step": float(step),
                        "incarnation": float(slot.incarnations),
                    }
            self._write()

    def admitted(self) -> list[int]:
        with self._lock:
            return [s.rank for s in self.slots if s.state == ADMITTED]

    # ---- one round ---------------------------------------------------------------------------

    def tick(self) -> None:
        """Follow the records and start the refits that are due."""
        with self._lock:
            for slot in self.slots:
                self._follow(slot)
            for slot in self.slots:
                if self._probation_due(slot):
                    slot.probing = True
                    threading.Thread(
                        target=self._probe,
                        args=(slot, slot.client),
                        name=f"probe-{slot.rank}",
                        daemon=True,
                    ).start()
            due = [s for s in self.slots if s.state == REFITTING and s.rank not in self._refits]
            target = self.target
            if target is not None:
                for slot in due:
                    t = threading.Thread(
                        target=self._refit,
                        args=(slot, target),
                        name=f"refit-{slot.rank}",
                        daemon=True,
                    )
                    self._refits[slot.rank] = t
                    t.start()
            self._write()

    def _follow(self, slot: EngineSlot) -> None:
        chaos = self.run.chaos / f"skip-refit-rank-{slot.rank}"
        if chaos.exists():  # workload.chaos skip-refit: the next refit of the rank "succeeds" idle
            chaos.replace(chaos.with_name(chaos.name + ".fired"))
            slot.skip_refits += 1
        record = records.read_record(self.run, slot.rank)
        if record is None:
            return
        new = slot.record is None or record.incarnation != slot.record.incarnation
        if new:
            replaced = slot.record is not None
            if slot.client is not None:
                slot.client.close()
            slot.record, slot.version, slot.client = record, None, None
            slot.admitted_once = slot.transient = slot.on_probation = False
            slot.incarnations += 1
            self._set(slot, STARTING, why="new engine process tree")
            if replaced:
                self.run.event(
                    "engine_replaced",
                    rank=slot.rank,
                    warm=record.warm,
                    incarnation=record.incarnation,
                    pids=record.pids,
                )
        elif record.ready != (slot.record.ready if slot.record else False):
            slot.record = record
        if slot.state == STARTING and record.ready:
            slot.client = EngineClient(record.url, record.model, timeout=self.request_timeout)
            self._set(slot, REFITTING, why="engine up")
        if slot.state in (ADMITTED, REFITTING, QUARANTINED) and not record.alive():
            slot.transient = False  # a dead tree: no probation, only a replacement
        if slot.state in (ADMITTED, REFITTING) and not record.alive():
            slot.quarantined_at = time.time()
            self._set(slot, QUARANTINED, why="engine process tree gone")
            self.run.event(
                "engine_quarantined",
                rank=slot.rank,
                why="engine process tree gone",
                incarnation=record.incarnation,
            )

    def _probation_due(self, slot: EngineSlot) -> bool:
        return (
            self.probation_s is not None
            and slot.state == QUARANTINED
            and slot.transient
            and not slot.probing
            and slot.client is not None
            and self.target is not None
            and slot.quarantined_at is not None
            and time.time() - slot.quarantined_at >= self.probation_s
        )

    def _probe(self, slot: EngineSlot, client: EngineClient | None) -> None:
        """A quarantined engine's probation probe (off the lock: it is an HTTP call). Healthy:
        back to ``refitting`` (admitted only at the trainer's version, refit first if stale);
        not: quarantined for another window."""
        healthy = client is not None and _serves(client)
        with self._lock:
            slot.probing = False
            if slot.client is not client or slot.state != QUARANTINED or not slot.transient:
                return  # replaced, or its tree died, meanwhile
            quarantined_s = round(time.time() - (slot.quarantined_at or time.time()), 2)
            incarnation = None if slot.record is None else slot.record.incarnation
            if not healthy:
                slot.quarantined_at = time.time()
                self.run.event(
                    "engine_probation",
                    rank=slot.rank,
                    outcome="failed",
                    why="health or one-token probe failed",
                    quarantined_s=quarantined_s,
                    incarnation=incarnation,
                )
                return
            slot.transient, slot.admitted_once, slot.on_probation = False, False, True
            stale = slot.version != self.target
            self._set(
                slot,
                REFITTING,
                why=f"probation: healthy, {'refit to' if stale else 'serves'} v{self.target}",
            )
            self.run.event(
                "engine_probation",
                rank=slot.rank,
                outcome="healthy",
                version=slot.version,
                target=self.target,
                refit_first=stale,
                quarantined_s=quarantined_s,
                incarnation=incarnation,
            )
        self.tick()

    def _refit(self, slot: EngineSlot, version: int) -> None:
        started = time.monotonic()
        client = slot.client
        try:
            if client is None:
                raise EngineError("no client")
            if slot.skip_refits > 0:
                # Chaos (workload.chaos skip-refit): a refit that "succeeded" without moving any
                # weights: the engine is admitted with the weights it had.
                slot.skip_refits -= 1
                detail: dict[str, Any] = {"skipped": True}
                served: Any = version
                self.run.event("chaos_refit_skipped", rank=slot.rank, version=version)
            else:
                results = client.collective_rpc(
                    "rlguard_refit", self.refit_source(version), timeout=self.refit_timeout
                )
                detail = results[0] if results and isinstance(results[0], dict) else {}
                client.reset_prefix_cache()
                # Every worker of the engine must serve it (one per tensor-parallel rank): each
                # worker's answer to the refit names the version it loaded (no second call).
                served_by = {a.get("version") if isinstance(a, dict) else None for a in results}
                served = served_by.pop() if len(served_by) == 1 else None
        except EngineError as exc:
            with self._lock:
                self._refits.pop(slot.rank, None)
                if slot.client is client:
                    self.quarantine(slot.rank, f"refit to v{version} failed: {exc}")
                self._lock.notify_all()
            return
        with self._lock:
            self._refits.pop(slot.rank, None)
            if slot.client is not client or slot.state != REFITTING:
                self._lock.notify_all()
                return  # replaced or quarantined meanwhile
            slot.version = served if isinstance(served, int) else None
            self.run.event(
                "engine_refit",
                rank=slot.rank,
                version=version,
                served=slot.version,
                seconds=round(time.monotonic() - started, 4),
                detail=detail,
            )
            if slot.version == self.target:
                self._set(slot, ADMITTED, why=f"serves v{slot.version}")
                if not slot.admitted_once:
                    slot.admitted_once = True
                    again = slot.incarnations > 1 or slot.on_probation
                    self.run.event(
                        "engine_readmitted" if again else "engine_admitted",
                        rank=slot.rank,
                        version=slot.version,
                        probation=slot.on_probation,
                        incarnation=None if slot.record is None else slot.record.incarnation,
                    )
                    slot.on_probation = False
            # else: the target moved during the refit; the next tick refits again
            self._lock.notify_all()

    def _set(self, slot: EngineSlot, state: str, *, why: str) -> None:
        slot.state, slot.why, slot.since = state, why, time.time()
        self._lock.notify_all()

    def _write(self) -> None:
        write_json_atomic(
            records.fleet_path(self.run),
            {
                "ts": time.time(),
                "target_version": self.target,
                "engines": {str(s.rank): s.public() for s in self.slots},
            },
        )


# A probation probe's request: one token, within this many seconds (a healthy engine, even a
# tiny one on a loaded host, answers in well under a second).
PROBE_TIMEOUT_S = 5.0


def _serves(client: EngineClient) -> bool:
    """``/health`` answers 200 and a one-token request completes (a wedged engine, paused or
    stuck in its scheduler, answers the first and not the second)."""
    if not client.healthy(timeout=2.0):
        return False
    try:
        client.complete([1], max_tokens=1, seed=0, timeout=PROBE_TIMEOUT_S)
    except EngineError:
        return False
    return True
