"""Child processes that ``rlguard up`` runs beside the API server (embedded mode).

Which children run is listed in ``app.runtime.UP_CHILDREN``. ``ChildSupervisor`` starts them,
restarts one that dies (with backoff, so a crash loop cannot spin), and stops them all on exit.

Children never outlive the parent, however it ends:

- each child runs in a process group of its own (a Celery worker forks its pool into it), and
  stopping a child ends its whole group (SIGTERM to the child, SIGKILL to the group after a
  grace period), so no pool process is left behind;
- each child holds the read end of a pipe (a *lifeline*) whose only write end the parent
  keeps; when the parent dies, even by SIGKILL, the kernel closes it, and the child's
  :func:`exit_with_parent` thread sees end-of-file and stops its group. (``PR_SET_PDEATHSIG``
  would fire when the parent *thread* that forked the child ends, and the supervisor restarts
  children from its watch thread; a pipe is tied to the process.)
- ``rlguard up`` turns SIGTERM into ``SystemExit`` (:func:`exit_on_sigterm`) so that the
  ``finally`` that stops the children runs: uvicorn re-raises the signal it caught once its
  graceful shutdown is done, which with the default action killed the process on the spot.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from types import FrameType

log = logging.getLogger("rlguard.supervisor")

LIFELINE_ENV = "RLGUARD_PARENT_LIFELINE_FD"
# After its parent is gone a child gets this long to stop (a Celery worker finishing its warm
# shutdown) before its process group is killed.
ORPHAN_GRACE_SECONDS = 10.0


@dataclass(frozen=True)
class ChildSpec:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


class ChildSupervisor:
    def __init__(
        self, specs: list[ChildSpec], *, max_backoff: float = 30.0, poll_interval: float = 1.0
    ) -> None:
        self.specs = specs
        self.max_backoff = max_backoff
        self.poll_interval = poll_interval
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._lifelines: dict[str, int] = {}  # write ends, one per child
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _spawn(self, spec: ChildSpec) -> None:
        read_end, write_end = os.pipe()  # both close-on-exec; pass_fds hands the child its end
        try:
            env = {**os.environ, **spec.env, LIFELINE_ENV: str(read_end)}
            proc = subprocess.Popen(
                spec.argv, env=env, pass_fds=(read_end,), start_new_session=True
            )
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        self._procs[spec.name] = proc
        self._lifelines[spec.name] = write_end
        log.info("started %s (pid %d)", spec.name, proc.pid)

    def _reap(self, name: str) -> None:
        """After a child's main process ended: what is left of its group goes, and so does its
        lifeline."""
        _kill_group(self._procs[name].pid, signal.SIGKILL)
        fd = self._lifelines.pop(name, None)
        if fd is not None:
            os.close(fd)

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
                self._reap(spec.name)
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
        """SIGTERM every child, wait up to ``timeout``, then kill what is left of each group."""
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
            self._reap(name)


def _kill_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass  # the group is already empty


# -- the child's side ------------------------------------------------------------------------


def exit_with_parent(grace_seconds: float = ORPHAN_GRACE_SECONDS) -> None:
    """In a child started by :class:`ChildSupervisor`: stop this process (and then its group)
    when the parent dies. Does nothing in a process that was not started that way."""
    fd_text = os.environ.pop(LIFELINE_ENV, None)  # not for this process's own children
    if fd_text is None:
        return
    fd = int(fd_text)
    threading.Thread(
        target=_wait_for_parent_exit,
        args=(fd, grace_seconds),
        name="rlguard-lifeline",
        daemon=True,
    ).start()


def _wait_for_parent_exit(fd: int, grace_seconds: float) -> None:
    while os.read(fd, 1):  # the parent never writes: this returns b"" once it is gone
        pass
    log.warning("parent process is gone; stopping (process group %d)", os.getpgrp())
    os.kill(os.getpid(), signal.SIGTERM)  # a clean stop first (a worker's warm shutdown)
    time.sleep(grace_seconds)  # the grace period; if it stopped, this thread is gone with it
    _kill_group(os.getpgrp(), signal.SIGKILL)


def exit_on_sigterm() -> None:
    """Make SIGTERM raise ``SystemExit(143)`` so that ``finally`` blocks (stopping the
    children) run; see the module docstring for why uvicorn needs this."""

    def handle(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handle)
