"""Child processes that ``rlguard up`` runs beside the API server (embedded mode).

``EMBEDDED_CHILDREN`` is a list of factories ``(settings) -> ChildSpec | None``; later features
(the Celery worker, the scheduler) append theirs. ``ChildSupervisor`` starts them, restarts one
that dies (with backoff, so a crash loop cannot spin), and stops them all on exit.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from app.core.config import Settings

log = logging.getLogger("rlguard.supervisor")


@dataclass(frozen=True)
class ChildSpec:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


EMBEDDED_CHILDREN: list[Callable[[Settings], ChildSpec | None]] = []


def embedded_children(settings: Settings) -> list[ChildSpec]:
    specs = [factory(settings) for factory in EMBEDDED_CHILDREN]
    return [s for s in specs if s is not None]


class ChildSupervisor:
    def __init__(
        self, specs: list[ChildSpec], *, max_backoff: float = 30.0, poll_interval: float = 1.0
    ) -> None:
        self.specs = specs
        self.max_backoff = max_backoff
        self.poll_interval = poll_interval
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _spawn(self, spec: ChildSpec) -> None:
        env = {**os.environ, **spec.env}
        self._procs[spec.name] = subprocess.Popen(spec.argv, env=env)
        log.info("started %s (pid %d)", spec.name, self._procs[spec.name].pid)

    def start(self) -> None:
        for spec in self.specs:
            self._spawn(spec)
        if self.specs:
            self._thread = threading.Thread(
                target=self._watch, name="rlguard-supervisor", daemon=True
            )
            self._thread.start()

    def _watch(self) -> None:
        backoff = {s.name: 1.0 for s in self.specs}
        started_at = {s.name: time.monotonic() for s in self.specs}
        while not self._stop.wait(self.poll_interval):
            for spec in self.specs:
                proc = self._procs[spec.name]
                code = proc.poll()
                if code is None:
                    continue
                if time.monotonic() - started_at[spec.name] > 60:
                    backoff[spec.name] = 1.0  # it ran a while: not a crash loop
                log.error(
                    "%s exited with %s; restarting in %.0f s", spec.name, code, backoff[spec.name]
                )
                if self._stop.wait(backoff[spec.name]):
                    return
                backoff[spec.name] = min(backoff[spec.name] * 2, self.max_backoff)
                self._spawn(spec)
                started_at[spec.name] = time.monotonic()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + timeout
        for name, proc in self._procs.items():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in time; killing it", name)
                proc.kill()
                proc.wait(5)
