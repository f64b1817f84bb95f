"""A function run on a thread of its own whenever it is woken, wake-ups coalesced.

``wake()`` only sets an event, so any thread (an event loop included) may call it without
blocking. Wake-ups that come while the function runs make exactly one more run after it: the
event is cleared before each run, so a wake-up is never lost, and a burst costs one run, not one
per wake-up. Used by the policy scheduler's event path (``app.scheduler``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("rlguard.wakeup")


class WakeThread:
    def __init__(self, run: Callable[[], None], *, name: str) -> None:
        self._run = run
        self._name = name
        self._woken = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        self._woken.set()

    def start(self) -> None:
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the run in progress, if any (a pending wake-up is dropped)."""
        self._stopping.set()
        self._woken.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
            self._thread = None

    def _loop(self) -> None:
        while True:
            self._woken.wait()
            if self._stopping.is_set():
                return
            self._woken.clear()
            try:
                self._run()
            except Exception:  # the thread must outlive a failed run; log it loudly
                log.exception("%s failed", self._name)
