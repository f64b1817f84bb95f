"""One value that every viewer of a page shares, served stale while one thread recomputes it.

The Overview's expensive parts (every node judged, the sparkline rollups) poll for every viewer;
computing them once per request would make the page as slow as its slowest query. A value here
is kept with the key it was computed for (which database, which store) and when:

- younger than ``fresh_for`` it is returned as it is;
- younger than ``stale_for`` it is returned too, and the first such caller starts one background
  thread that computes it again (no request waits for the query; later callers keep getting the
  previous value until the thread is done);
- older, for another key, or with no value yet, the caller computes it itself.

A refresh that fails keeps the previous value and logs; the next caller past ``fresh_for``
tries again, and one past ``stale_for`` computes it itself (and fails visibly).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from sqlalchemy.engine import Engine
from sqlmodel import Session

log = logging.getLogger("rlguard.views.shared")

V = TypeVar("V")
Compute = Callable[[Session, float], V]  # (session, now) -> value


class StaleWhileRefresh(Generic[V]):
    def __init__(self, *, thread_name: str, what: str) -> None:
        self.thread_name = thread_name  # the refresh thread's name
        self.what = what  # what failed, in the log line of a failed refresh
        self._lock = threading.Lock()
        self._key: Hashable = None
        self._built_at = -math.inf
        self._value: V | None = None
        self._refreshing = False

    @property
    def value(self) -> V | None:
        with self._lock:
            return self._value

    def forget(self) -> None:
        """The next caller computes the value itself."""
        with self._lock:
            self._key, self._built_at, self._value = None, -math.inf, None
            self._refreshing = False

    def get(
        self,
        session: Session,
        *,
        key: Hashable,
        now: float,
        compute: Compute[V],
        fresh_for: float,
        stale_for: float = math.inf,
    ) -> V:
        """The value for ``key`` as of ``now`` (see the module's docstring); ``compute`` runs with
        ``session`` here, or with a session of its own on the refresh thread, with this ``now``."""
        with self._lock:
            age = now - self._built_at
            if self._value is not None and self._key == key and 0 <= age < stale_for:
                if age >= fresh_for and not self._refreshing:
                    self._refreshing = True
                    threading.Thread(
                        target=self._refresh,
                        args=(session.get_bind(), key, now, compute),
                        name=self.thread_name,
                        daemon=True,
                    ).start()
                return self._value
        value = compute(session, now)
        self._keep(key, now, value)
        return value

    def _keep(self, key: Hashable, now: float, value: V) -> None:
        with self._lock:
            # A slower computation for an earlier time never replaces a newer value.
            if now >= self._built_at or self._key != key:
                self._key, self._built_at, self._value = key, now, value

    def _refresh(self, engine: Engine, key: Hashable, now: float, compute: Compute[V]) -> None:
        try:
            with Session(engine) as session:
                value = compute(session, now)
            self._keep(key, now, value)
        except Exception:
            log.exception("%s failed; the previous value stays", self.what)
        finally:
            with self._lock:
                self._refreshing = False
