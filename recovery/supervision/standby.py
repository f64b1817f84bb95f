"""Warm standby processes: a spare that has already paid for starting Python and importing the
heavy modules (torch, transformers, trl), waiting to become a process that died.

Starting a training process from scratch is mostly interpreter start-up and imports: seconds,
every one of them on the recovery path. A standby does that work ahead of time and then blocks
on its stdin. To replace a dead process the launcher writes one *order*, a JSON line::

    {"argv": ["python", "train.py", "--resume_from_checkpoint", "ckpt/checkpoint-40"],
     "log": "RUN/logs/trainer-0.log", "env": {"RANK": "0", ...}, "cwd": "/home/me/job"}

and the standby becomes that process: it takes ``env`` and ``cwd``, sends its output to
``log`` and runs the script in-process (:mod:`runpy`), as ``python SCRIPT ARGS`` or
``python -m MODULE ARGS`` would. End of input without an order (the launcher stopping) ends
it; a bad order is refused on stderr with exit code 2, and nothing is run.

:class:`StandbyPool` is the launcher's side: one standby per role, started at a lower CPU
priority, activated by an order. ``python -m recovery.supervision.standby_process`` is the
standby (:mod:`recovery.supervision.standby_process`).
"""

from __future__ import annotations

import json
import logging
import os
import runpy
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recovery.errors import RecoveryError
from recovery.report import START_PHASES

log = logging.getLogger("rlguard.recovery.supervision")


def reports_steadily(
    beat: Mapping[str, Any] | None,
    *,
    pid: int | None = None,
    max_age: float | None = None,
    now: float | None = None,
) -> bool:
    """Whether the heartbeat ``beat`` is a steady process's: past its start and, where given,
    written by ``pid`` and no older than ``max_age`` seconds at ``now``. Standbys (each importing
    torch for seconds) start only once every process of a job reports steadily, never while the
    job starts or recovers, when CPU is what it lacks."""
    if not beat or beat.get("phase") in START_PHASES:
        return False
    if pid is not None and beat.get("pid") != pid:
        return False
    if max_age is not None:
        age = (time.time() if now is None else now) - float(beat.get("ts") or 0.0)
        if age >= max_age:
            return False
    return True


# How much lower a standby's CPU priority is while it imports: that must not slow the running
# job. Only lowered where it can be raised back on activation (root); mild, so that a busy
# machine does not starve it for longer than the time between faults.
STANDBY_NICE = 5


class OrderError(RecoveryError, ValueError):
    """The launcher's order cannot be carried out; the message says why."""


@dataclass(frozen=True)
class Order:
    """What a standby is told to become."""

    argv: list[str]
    log: str
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None

    def to_line(self) -> bytes:
        body: dict[str, Any] = {"argv": self.argv, "log": self.log}
        if self.env:
            body["env"] = self.env
        if self.cwd is not None:
            body["cwd"] = self.cwd
        return (json.dumps(body) + "\n").encode()


def parse_order(line: str) -> Order:
    """The order in ``line``; :class:`OrderError` names what is wrong."""
    try:
        body: Any = json.loads(line)
    except json.JSONDecodeError as exc:
        raise OrderError(f"the order is not JSON: {exc}") from exc
    if not isinstance(body, dict) or not {"argv", "log"} <= set(body) <= {
        "argv",
        "log",
        "env",
        "cwd",
    }:
        raise OrderError(
            f"the order must be an object with argv and log (and optionally env, cwd), "
            f"got {line.strip()!r}"
        )
    argv, log_path = body["argv"], body["log"]
    env, cwd = body.get("env", {}), body.get("cwd")
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise OrderError(f"argv must be a list of strings, got {argv!r}")
    if not isinstance(log_path, str) or not log_path:
        raise OrderError(f"log must be a file path, got {log_path!r}")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise OrderError(f"env must map names to strings, got {env!r}")
    if cwd is not None and (not isinstance(cwd, str) or not cwd):
        raise OrderError(f"cwd must be a directory path, got {cwd!r}")
    return Order(argv, log_path, env, cwd)


@dataclass(frozen=True)
class PythonTarget:
    """What ``python SCRIPT ARGS`` or ``python -m MODULE ARGS`` runs."""

    kind: str  # "script" or "module"
    target: str
    args: list[str]


def _same_interpreter(program: str) -> bool:
    found = shutil.which(program)
    if found is None:
        return False
    mine = os.path.abspath(sys.executable)
    return os.path.abspath(found) == mine or os.path.realpath(found) == os.path.realpath(mine)


def python_target(argv: list[str]) -> PythonTarget:
    """The script or module ``argv`` runs with this interpreter; :class:`OrderError` when
    ``argv`` is not ``PYTHON SCRIPT ...`` or ``PYTHON -m MODULE ...`` (a standby can take over
    only a Python process of its own interpreter, started without other interpreter options)."""
    if not argv or not _same_interpreter(argv[0]):
        raise OrderError(
            f"a standby runs Python scripts with {sys.executable}; the command starts "
            f"{argv[0] if argv else 'nothing'!r}"
        )
    if len(argv) >= 3 and argv[1] == "-m":
        return PythonTarget("module", argv[2], argv[3:])
    if len(argv) >= 2 and not argv[1].startswith("-"):
        return PythonTarget("script", argv[1], argv[2:])
    raise OrderError(
        f"a standby runs 'python SCRIPT ...' or 'python -m MODULE ...', got {' '.join(argv)!r}"
    )


def redirect_output(log_path: str) -> None:
    """Send this process's stdout and stderr to ``log_path`` (appended) and close its stdin."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
    finally:
        os.close(null)


def run_python_target(target: PythonTarget) -> int:
    """Run ``target`` in this process as the interpreter would run it; its exit code."""
    try:
        if target.kind == "module":
            sys.path.insert(0, os.getcwd())
            sys.argv = [target.target, *target.args]
            runpy.run_module(target.target, run_name="__main__", alter_sys=True)
        else:
            script = os.path.abspath(target.target)
            sys.path.insert(0, os.path.dirname(script))
            sys.argv = [target.target, *target.args]
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        sys.stderr.write(f"{code}\n")
        return 1
    return 0


def become(order: Order) -> int:
    """Take the order's environment, directory and log, and run its Python command."""
    target = python_target(order.argv)
    os.environ.update(order.env)
    if order.cwd is not None:
        os.chdir(order.cwd)
    redirect_output(order.log)
    return run_python_target(target)


class StandbyPool:
    """The launcher's warm standbys, one per role.

    ``command(role)`` is the argv that starts a standby for ``role``; ``on_event(kind,
    **fields)`` records the pool's events on the launcher's timeline.
    """

    def __init__(
        self,
        command: Callable[[str], list[str]],
        *,
        log_dir: Path,
        env: Mapping[str, str] | None = None,
        on_event: Callable[..., None] = lambda kind, **fields: None,
    ) -> None:
        self._command = command
        self._log_dir = log_dir
        self._env = dict(os.environ if env is None else env)
        self._on_event = on_event
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, role: str) -> None:
        """Start a standby for ``role`` (at a lower CPU priority where it can be raised back)."""
        self._log_dir.mkdir(parents=True, exist_ok=True)
        lower = os.geteuid() == 0
        with open(self._log_dir / f"standby-{role}.log", "ab") as logfile:
            proc = subprocess.Popen(
                self._command(role),
                env=self._env,
                stdout=logfile,
                stderr=logfile,
                stdin=subprocess.PIPE,
                preexec_fn=(lambda: os.nice(STANDBY_NICE)) if lower else None,
            )
        self.procs[role] = proc
        self._on_event("standby_start", role=role, child_pid=proc.pid)

    def reap(self) -> None:
        """Forget standbys that died while waiting (killed, out of memory)."""
        for role, proc in list(self.procs.items()):
            if proc.poll() is not None:
                log.warning("standby %s exited (%s) while waiting", role, proc.returncode)
                self._on_event("standby_exit", role=role, code=proc.returncode)
                del self.procs[role]

    def missing(self, roles: set[str]) -> list[str]:
        """Roles of ``roles`` without a standby."""
        return sorted(roles - set(self.procs))

    def activate(self, role: str, order: bytes) -> subprocess.Popen[bytes] | None:
        """Hand ``order`` (one line) to ``role``'s standby and return it, now the process; None
        when there is no live standby for the role (start the process cold)."""
        proc = self.procs.pop(role, None)
        if proc is None:
            return None
        if proc.poll() is not None or proc.stdin is None:
            log.warning("standby %s exited (%s): starting the role cold", role, proc.returncode)
            return None
        try:
            # Back to the launcher's priority before it has work to do (root may raise it).
            os.setpriority(os.PRIO_PROCESS, proc.pid, os.getpriority(os.PRIO_PROCESS, 0))
        except OSError as exc:
            log.warning("standby %s keeps its lower CPU priority: %s", role, exc)
        try:
            proc.stdin.write(order)
            proc.stdin.close()
        except OSError as exc:  # it died between the poll and the write
            log.warning("standby %s did not take its order (%s): starting the role cold", role, exc)
            _kill(proc)
            return None
        return proc

    def close(self, timeout: float) -> None:
        """End every standby: end of input first (a standby exits), then SIGKILL after
        ``timeout`` seconds."""
        for proc in self.procs.values():
            if proc.stdin is not None:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
        for proc in self.procs.values():
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill(proc)
        self.procs.clear()


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            proc.kill()
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)
