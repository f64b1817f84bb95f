"""Where the hot series window lives: in this process only, or shared through Redis.

The policy engine, the dashboard and ``/metrics`` always read the in-process
:class:`~app.series.store.SeriesStore`; what differs is how samples get there:

* ``LocalSeriesBackend`` (the embedded default): ingest appends to the store and that is all.
* ``RedisSeriesBackend`` (``RLGUARD_SERIES__SHARED_WINDOW=true`` with ``RLGUARD_REDIS_URL``):
  every ingest group is also appended, in one pipelined round trip, to a Redis stream trimmed to
  ``window_seconds``, and the participants' latest heartbeats to a hash. Every replica follows
  the stream into its own store (the whole retained stream first, on start or on taking the
  lease), so any replica can take any agent's batch and the lease holder judges them all. Keys
  carry a prefix derived from the database URL: one deployment shares one window.

An acknowledged sample is visible to the lease holder on its next follow (ingest answers only
after the stream append). A group that carries a certain fault (``app.ingest.certain``) is also
announced on a Redis channel the followers wait on, so the lease holder applies it at once and
tells the scheduler's event path.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
import redis

from app.series.store import SeriesKey, SeriesStore

log = logging.getLogger("rlguard.series.redis")

Sample = tuple[SeriesKey, float, float]

_STOP_CHECK_SECONDS = 0.5  # the longest a stopping follower waits on the channel


@dataclass(frozen=True, slots=True)
class ParticipantHeartbeat:
    """A participant's latest heartbeat, as this replica or (through a shared window) any
    replica saw it."""

    job: str
    role: str
    rank: int
    node: str
    phase: str
    step: int
    ts: float


class SeriesBackend(Protocol):
    """What ingest and the server need from a window backend."""

    shared: bool

    def publish(
        self,
        samples: list[Sample],
        participants: list[ParticipantHeartbeat],
        *,
        certain: bool = False,
    ) -> None:
        """Make one commit group's samples visible to every replica (blocking; may raise);
        ``certain``: the group carries a certain fault, announce it to the other replicas."""

    def on_certain(self, listener: Callable[[], None] | None) -> None:
        """Call ``listener`` (from the follower's thread) once another replica's group that
        carried a certain fault is applied to this replica's store."""

    def start(self, store: SeriesStore) -> None:
        """Begin applying other replicas' samples to ``store``."""

    def stop(self) -> None: ...

    def participants(self) -> list[ParticipantHeartbeat]:
        """Every participant's latest heartbeat known to the deployment."""


class LocalSeriesBackend:
    """The single-process window: nothing to share."""

    shared = False

    def publish(
        self,
        samples: list[Sample],
        participants: list[ParticipantHeartbeat],
        *,
        certain: bool = False,
    ) -> None:
        return None

    def on_certain(self, listener: Callable[[], None] | None) -> None:
        return None

    def start(self, store: SeriesStore) -> None:
        return None

    def stop(self) -> None:
        return None

    def participants(self) -> list[ParticipantHeartbeat]:
        return []


def key_prefix(database_url: str) -> str:
    digest = hashlib.sha256(database_url.encode()).hexdigest()[:16]
    return f"rlguard:{digest}"


def forget_shared_window(redis_url: str, database_url: str) -> int:
    """Delete every key the shared window of ``database_url`` holds in Redis (a retired
    deployment, a test or benchmark run); returns how many were deleted."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=key_prefix(database_url) + ":*", count=1000))
        return int(client.delete(*keys)) if keys else 0
    finally:
        client.close()


def _encode(samples: list[Sample]) -> bytes:
    return orjson.dumps([[k.node, k.name, k.labels, ts, v] for k, ts, v in samples])


def _decode(data: bytes) -> list[Sample]:
    out: list[Sample] = []
    for node, name, labels, ts, value in orjson.loads(data):
        out.append((SeriesKey(node, name, tuple((a, b) for a, b in labels)), ts, value))
    return out


class RedisSeriesBackend:
    """The shared window: a Redis stream of commit groups plus a hash of participants."""

    shared = True

    def __init__(
        self,
        *,
        redis_url: str,
        database_url: str,
        window_seconds: float,
        follow_interval: float = 0.5,
        timeout: float = 3.0,
        replica_id: str | None = None,
    ) -> None:
        if window_seconds <= 0 or follow_interval <= 0 or timeout <= 0:
            raise ValueError("window_seconds, follow_interval and timeout must be positive")
        self.prefix = key_prefix(database_url)
        self.stream = f"{self.prefix}:series"
        self.heartbeats = f"{self.prefix}:participants"
        self.certain_channel = f"{self.prefix}:certain"
        self._on_certain: Callable[[], None] | None = None
        self.window_seconds = window_seconds
        self.follow_interval = follow_interval
        self.replica_id = replica_id or f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self._redis: Any = redis.Redis.from_url(
            redis_url, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        self._last_id = b"0-0"
        self._participants: dict[tuple[str, str, int], ParticipantHeartbeat] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._kick = threading.Event()  # a listener was registered: subscribe without waiting
        self._thread: threading.Thread | None = None
        self._store: SeriesStore | None = None

    # -- writing ---------------------------------------------------------------------------

    def publish(
        self,
        samples: list[Sample],
        participants: list[ParticipantHeartbeat],
        *,
        certain: bool = False,
    ) -> None:
        pipe = self._redis.pipeline(transaction=False)
        if samples:
            pipe.xadd(self.stream, {"r": self.replica_id, "d": _encode(samples)})
            # Stream ids are milliseconds: everything older than the window goes.
            horizon_ms = int((time.time() - self.window_seconds) * 1000)
            pipe.xtrim(self.stream, minid=f"{horizon_ms}-0", approximate=True)
        if participants:
            pipe.hset(
                self.heartbeats,
                mapping={
                    f"{p.job}\x1f{p.role}\x1f{p.rank}": orjson.dumps(
                        [p.node, p.phase, p.step, p.ts]
                    )
                    for p in participants
                },
            )
        if certain:  # after the data in the pipeline: a follower woken by it finds the group
            pipe.publish(self.certain_channel, self.replica_id)
        if samples or participants or certain:
            pipe.execute()

    def on_certain(self, listener: Callable[[], None] | None) -> None:
        self._on_certain = listener
        self._kick.set()

    # -- following ---------------------------------------------------------------------------

    def follow_once(self, store: SeriesStore) -> int:
        """Apply other replicas' entries added since the last call; returns samples applied."""
        applied = 0
        while True:
            batch = self._redis.xread({self.stream: self._last_id}, count=1000)
            if not batch:
                break
            entries = batch[0][1]
            for entry_id, fields in entries:
                self._last_id = entry_id
                if fields.get(b"r", b"").decode() == self.replica_id:
                    continue  # this replica's own group is already in its store
                applied += store.extend(_decode(fields[b"d"]))
            if len(entries) < 1000:
                break
        raw = self._redis.hgetall(self.heartbeats)
        fresh: dict[tuple[str, str, int], ParticipantHeartbeat] = {}
        for k, v in raw.items():
            job, role, rank = k.decode().split("\x1f")
            node, phase, step, ts = orjson.loads(v)
            fresh[(job, role, int(rank))] = ParticipantHeartbeat(
                job, role, int(rank), node, phase, int(step), float(ts)
            )
        with self._lock:
            self._participants = fresh
        return applied

    def _follow_loop(self) -> None:
        assert self._store is not None
        failing = False
        pubsub: Any = None
        woken = False
        while not self._stop.is_set():
            try:
                self.follow_once(self._store)
                listener = self._on_certain
                if woken and listener is not None:
                    listener()  # the group that woke us is in the store now
                if failing:
                    log.warning("shared series window reachable again")
                failing = False
                if pubsub is None and listener is not None:
                    pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
                    pubsub.subscribe(self.certain_channel)
                woken = self._wait(pubsub)
            except redis.RedisError as exc:
                # Ingest answers 503 while Redis is away (it cannot publish); following just
                # catches up from the last entry it applied once Redis is back.
                if not failing:
                    log.error("shared series window unreachable: %s", exc)
                failing = True
                if pubsub is not None:
                    pubsub.close()
                    pubsub = None
                woken = False
                self._stop.wait(self.follow_interval)
        if pubsub is not None:
            pubsub.close()

    def _wait(self, pubsub: Any) -> bool:
        """Until the next follow: a follow interval, or less when another replica announces a
        certain fault (True then)."""
        if pubsub is None:
            self._kick.wait(self.follow_interval)
            self._kick.clear()
            return False
        own = self.replica_id.encode()
        deadline = time.monotonic() + self.follow_interval
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            # In slices: ``stop`` must not wait a whole follow interval for this thread.
            msg = pubsub.get_message(timeout=min(left, _STOP_CHECK_SECONDS))
            if msg is not None and msg.get("data") != own:
                return True
        return False

    def start(self, store: SeriesStore) -> None:
        self._store = store
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._follow_loop, name="rlguard-series-follow", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._kick.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self._redis.close()

    def participants(self) -> list[ParticipantHeartbeat]:
        with self._lock:
            return list(self._participants.values())


def participants_of(batch_participants: Iterable[Any], node: str) -> list[ParticipantHeartbeat]:
    return [
        ParticipantHeartbeat(p.job, p.role, p.rank, node, p.phase, p.step, p.ts)
        for p in batch_participants
    ]
