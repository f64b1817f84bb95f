"""An in-memory stand-in for the Redis/PostgreSQL lease (the library boundary), for unit tests.
The real backends are exercised in tests/integration/checkpoint."""

from __future__ import annotations

import threading
import time
from typing import Any

from recovery.checkpoint.lease import LeaseGrant


class MemoryLease:
    def __init__(self, name: str = "test", ttl: float = 1.0) -> None:
        self.name = name
        self.ttl = ttl
        self._holder: str | None = None
        self._expires = 0.0
        self._epoch = 0
        self._state: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def _held_by(self, holder: str) -> bool:
        return self._holder == holder and time.monotonic() < self._expires

    def try_acquire(self, holder: str) -> LeaseGrant | None:
        with self._lock:
            if self._held_by(holder):
                self._expires = time.monotonic() + self.ttl
                return LeaseGrant(holder, self._epoch)
            if self._holder is not None and time.monotonic() < self._expires:
                return None
            self._holder, self._expires = holder, time.monotonic() + self.ttl
            self._epoch += 1
            return LeaseGrant(holder, self._epoch)

    def renew(self, holder: str) -> bool:
        with self._lock:
            if self._held_by(holder):
                self._expires = time.monotonic() + self.ttl
                return True
            return False

    def release(self, holder: str) -> None:
        with self._lock:
            if self._held_by(holder):
                self._holder = None

    def current_holder(self) -> str | None:
        with self._lock:
            return self._holder if time.monotonic() < self._expires else None

    def publish(self, holder: str, state: dict[str, Any]) -> bool:
        with self._lock:
            if self._held_by(holder):
                self._state = dict(state)
                return True
            return False

    def read_state(self) -> dict[str, Any] | None:
        with self._lock:
            return None if self._state is None else dict(self._state)

    def close(self) -> None:
        pass
