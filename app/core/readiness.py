"""What ``/readyz`` asks before it says a replica may take traffic.

A replica is ready when everything acknowledged work depends on answers: the database (a
trivial query), the ingest group committer (alive, and its commits not failing), and in cluster
mode the broker (Redis, ``RLGUARD_REDIS_URL``): actions and alert deliveries are handed to Celery
through it, so while it is down the outbox cannot send anything and an orchestrator must see
it. In embedded mode the broker is a SQLite file beside the database and has no check of its
own.

The answer names every part it checked, and a failing part says why, so the 503 itself tells
an operator which dependency to look at.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

import redis
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool

from app.core.db import ping

log = logging.getLogger("rlguard.health")


class IngestHealth(Protocol):
    """What readiness reads of the ingest service (``app.ingest.pipeline.IngestService``)."""

    def committer_alive(self) -> bool: ...

    def commits_failing_for(self) -> float | None: ...


@dataclass(slots=True)
class Readiness:
    """Each checked part and its state (``"ok"`` or why not); ready only when all are ok."""

    parts: dict[str, str] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return all(state == "ok" for state in self.parts.values())

    def body(self) -> dict[str, str]:
        return {"status": "ok" if self.ready else "unavailable", **self.parts}


class ReadinessProbe:
    """The checks of one server process; ``broker_url`` is set in cluster mode only."""

    def __init__(
        self, *, engine: Engine, ingest: IngestHealth, broker_url: str | None, timeout: float
    ) -> None:
        self.engine = engine
        self.ingest = ingest
        # One client, kept: a probe every few seconds must not open a connection pool each time.
        self._broker = (
            redis.Redis.from_url(broker_url, socket_timeout=timeout, socket_connect_timeout=timeout)
            if broker_url
            else None
        )

    async def check(self) -> Readiness:
        result = Readiness()
        try:
            await run_in_threadpool(ping, self.engine)
            result.parts["database"] = "ok"
        except (SQLAlchemyError, OSError) as exc:
            log.warning("readiness: database unreachable: %s", type(exc).__name__)
            result.parts["database"] = f"unreachable ({type(exc).__name__})"
        if self._broker is not None:
            result.parts["broker"] = await run_in_threadpool(self._broker_state)
        result.parts["ingest"] = self._ingest_state()
        return result

    def _broker_state(self) -> str:
        assert self._broker is not None
        try:
            self._broker.ping()
        except (redis.RedisError, OSError) as exc:
            log.warning("readiness: broker (Redis) unreachable: %s", type(exc).__name__)
            return f"Redis unreachable ({type(exc).__name__})"
        return "ok"

    def _ingest_state(self) -> str:
        if not self.ingest.committer_alive():
            return "committer stopped"
        # The database ping can pass while the group commit keeps failing (a failure only the
        # ingest writes hit, such as a full disk): acknowledged ingest is stalled then.
        failing = self.ingest.commits_failing_for()
        if failing is not None:
            return f"group commits failing for {failing:.1f} s"
        return "ok"

    def close(self) -> None:
        if self._broker is not None:
            self._broker.close()
