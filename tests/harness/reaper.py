"""Every process a test starts is started here, in a process group of its own, and reaped.

Guards, so that a pytest that dies (even by ``kill -9``) leaves nothing running:

- the direct child gets ``PR_SET_PDEATHSIG`` = SIGKILL: it dies with the pytest process;
- its process group is announced to a guardian process (``_guardian.py``) over a pipe; when
  pytest dies, the pipe closes and the guardian kills every group still announced (this also
  reaches grandchildren that the direct child started in its group, like Celery's pool);
- the run's environment carries a token (``PYTEST_RLGUARD_RUN``) that every descendant inherits,
  also those that product code starts in sessions of their own (``app.cli.demo.DemoStack``'s server,
  agents and workers); the guardian kills every process that carries it;
- at the end of a normal session, ``reap_all()`` (``pytest_sessionfinish`` in
  ``tests/conftest.py``) does the same for whatever a test left behind.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import IO, Any

from tests.harness._guardian import TOKEN_VAR, kill_all

PR_SET_PDEATHSIG = 1

_lock = threading.Lock()
_guardian: subprocess.Popen[str] | None = None
_started: dict[int, subprocess.Popen[Any]] = {}


def _die_with_parent() -> None:
    """preexec_fn: a group of its own, and SIGKILL when the parent (pytest) dies."""
    os.setsid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def start_run() -> str:
    """Mark this process's environment with a token of its own (a nested pytest gets a new one)
    and start its guardian; returns the token. Idempotent."""
    token = os.environ.get(TOKEN_VAR, "")
    if not token.startswith(f"{os.getpid()}-"):
        token = f"{os.getpid()}-{uuid.uuid4().hex}"
        os.environ[TOKEN_VAR] = token
    with _lock:
        _ensure_guardian(token)
    return token


def _ensure_guardian(token: str) -> None:
    global _guardian
    if _guardian is None or _guardian.poll() is not None:
        _guardian = subprocess.Popen(
            # run by path: importing the tests.harness package would be slow and is not needed
            [sys.executable, str(Path(__file__).with_name("_guardian.py")), token],
            stdin=subprocess.PIPE,
            text=True,
            # Its own session: a Ctrl-C to pytest's group must not kill it before it reaps.
            start_new_session=True,
        )


def _tell_guardian(line: str) -> None:
    assert _guardian is not None and _guardian.stdin is not None
    _guardian.stdin.write(line + "\n")
    _guardian.stdin.flush()


def spawn(
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | str | None = None,
    log: Path | None = None,
    stdout: int | IO[Any] | None = None,
    **popen: Any,
) -> subprocess.Popen[Any]:
    """Start ``argv`` in a new process group that cannot outlive this pytest process.

    Output goes to ``log`` (appended, stdout and stderr together) when given, else to
    ``stdout``. ``PR_SET_PDEATHSIG`` fires when the *thread* that forked exits, so it is only
    set when spawning from the main thread; the guardian covers the rest.
    """
    popen.pop("start_new_session", None)  # the preexec function starts the session
    token = start_run()
    if env is not None:  # an environment built before the run began still carries its token
        env = {**env, TOKEN_VAR: token}
    main_thread = threading.current_thread() is threading.main_thread()
    preexec = _die_with_parent if main_thread else os.setsid
    with _lock:
        if log is not None:
            with log.open("ab") as out:
                proc = subprocess.Popen(
                    argv,
                    env=env,
                    cwd=cwd,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    preexec_fn=preexec,
                    **popen,
                )
        else:
            proc = subprocess.Popen(
                argv, env=env, cwd=cwd, stdout=stdout, preexec_fn=preexec, **popen
            )
        _started[proc.pid] = proc
        _tell_guardian(f"+{proc.pid}")
    return proc


def kill_group(proc: subprocess.Popen[Any], sig: int = signal.SIGKILL, timeout: float = 10) -> None:
    """Send ``sig`` to the whole group of a process started by ``spawn``; wait when it is SIGKILL."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    if sig == signal.SIGKILL:
        proc.wait(timeout)
        forget(proc)


def forget(proc: subprocess.Popen[Any]) -> None:
    """The group is gone: the guardian must not kill a later group that reuses its id."""
    with _lock:
        if _started.pop(proc.pid, None) is not None and _guardian is not None:
            try:
                _tell_guardian(f"-{proc.pid}")
            except (BrokenPipeError, OSError):
                pass


def reap_all() -> None:
    """Kill every group and every process of this run still running; called when the session
    ends (the guardian then has nothing left to do and exits)."""
    global _guardian
    token = os.environ.get(TOKEN_VAR, "")
    if not token.startswith(f"{os.getpid()}-"):
        return  # this process started no run
    groups = {proc.pid for proc in _started.values()}
    spare = {os.getpid()} | ({_guardian.pid} if _guardian is not None else set())
    kill_all(groups, token, spare=spare)
    for proc in _started.values():
        proc.poll()  # collect the exit status: no zombies
    _started.clear()
    if _guardian is not None and _guardian.stdin is not None:
        _guardian.stdin.close()
        _guardian.wait(10)
        _guardian = None
