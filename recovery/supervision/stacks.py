"""Hang forensics: the Python stacks of a supervised process, taken with ``py-spy dump``.

A hung or stalled process is about to be killed and restarted; its stacks are the only record
of *where* it hung. :func:`capture_stacks` takes them from outside the process (py-spy reads
its memory through ptrace: nothing runs inside the target, so a process stuck in a collective,
a deadlock or even SIGSTOPped can still be read) within a ``timeout`` and cuts the text at
``max_bytes`` with a marker. It never raises for the target's sake: a missing py-spy, ptrace
denied, a process that is gone or a dump that ran out of time come back as a capture with
``ok=False`` and the reason, because a capture must never stand in the way of the restart.

ptrace needs the right to trace the target: the same user and ``kernel.yama.ptrace_scope`` 0,
or ``CAP_SYS_PTRACE`` (in a container: ``--cap-add SYS_PTRACE``). See docs/deploy.md.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from recovery.pids import process_exists

#: The default bound on one process's stacks (the incident keeps at most this much text).
DEFAULT_MAX_BYTES = 64 * 1024
DEFAULT_TIMEOUT = 10.0
TRUNCATED_MARKER = "\n[... truncated by RLGuard: {n} more bytes ...]\n"
_ERROR_LINES = 6  # of py-spy's stderr, for the reason (its Rust backtrace is off)


@dataclass(frozen=True, slots=True)
class StackCapture:
    """One ``py-spy dump`` of one process: its text, or why there is none."""

    pid: int
    ok: bool
    text: str = ""
    reason: str = ""
    truncated: bool = False
    captured_at: float = 0.0  # wall clock of the dump's start, this machine's
    duration_s: float = 0.0
    nonblocking: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The capture as JSON-ready fields (what the launcher hook answers)."""
        return asdict(self)

    @staticmethod
    def gone(pid: int, code: int | None) -> StackCapture:
        """No stacks: the process exited before the capture."""
        reason = f"process gone: it exited ({code}) before the capture"
        return StackCapture(pid, False, reason=reason, captured_at=time.time())


# A capture_stacks request's bounds, whatever it says: the launcher's loop waits for the dumps.
_MAX_CAPTURE_SECONDS = 60.0
_MAX_CAPTURE_BYTES = 1024 * 1024


def capture_limits(options: Any) -> tuple[float, int]:
    """``(timeout, max_bytes)`` of a ``capture_stacks`` request's options, within the bounds;
    ValueError naming them when they are not numbers."""
    opts = options if isinstance(options, dict) else {}
    try:
        timeout = float(opts.get("timeout_seconds", DEFAULT_TIMEOUT))
        max_bytes = int(opts.get("max_bytes", DEFAULT_MAX_BYTES))
    except (TypeError, ValueError):
        raise ValueError(f"capture_stacks: bad timeout or size in {opts!r}") from None
    timeout = min(max(timeout, 0.1), _MAX_CAPTURE_SECONDS)
    return timeout, min(max(max_bytes, 1024), _MAX_CAPTURE_BYTES)


def find_py_spy() -> str | None:
    """The py-spy executable: the one installed beside this Python (a virtual environment's
    ``bin/``, where ``pip install rlguard`` puts it, PATH or not), else the one on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def truncate(text: str, max_bytes: int) -> tuple[str, bool]:
    """``text`` cut to at most ``max_bytes`` bytes of UTF-8, the marker included when cut."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text, False
    marker = TRUNCATED_MARKER.format(n=len(data))  # an upper bound keeps the sum within bounds
    keep = max(0, max_bytes - len(marker.encode("utf-8")))
    head = data[:keep].decode("utf-8", errors="ignore")  # never half a character
    cut = len(data) - len(head.encode("utf-8"))
    return head + TRUNCATED_MARKER.format(n=cut), True


def _stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP, a debugger): state ``T`` or ``t`` in /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    # The command name is in parentheses and may hold spaces: the state follows the last ')'.
    return stat.rpartition(")")[2].split()[:1] in (["T"], ["t"])


def _reason(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
    text = " | ".join(lines[:_ERROR_LINES]) or proc.stdout.strip()[-300:]
    return f"py-spy exited {proc.returncode}: {text or 'no output'}"


def _dump(
    py_spy: str, pid: int, *, nonblocking: bool, timeout: float
) -> subprocess.CompletedProcess[str]:
    argv = [py_spy, "dump", "--pid", str(pid), "--subprocesses"]
    if nonblocking:
        argv.append("--nonblocking")
    env = {**os.environ, "RUST_BACKTRACE": "0", "RUST_LIB_BACKTRACE": "0"}
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
        env=env,
        check=False,
    )


def capture_stacks(
    pid: int,
    *,
    py_spy: str | None,
    timeout: float = DEFAULT_TIMEOUT,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> StackCapture:
    """``py-spy dump`` of ``pid`` (and its child processes) within ``timeout`` seconds.

    A running process is paused for the dump, so its threads' stacks agree with each other. A
    stopped one cannot be paused again (py-spy fails to suspend it), and needs no pausing: it
    is read without (``--nonblocking``); so is a process that could not be paused, as a second
    try within what is left of ``timeout``. ``py_spy`` None means it is not installed.
    """
    start, started_at = time.monotonic(), time.time()

    def failed(reason: str) -> StackCapture:
        return StackCapture(
            pid,
            False,
            reason=reason,
            captured_at=started_at,
            duration_s=round(time.monotonic() - start, 3),
        )

    if py_spy is None:
        return failed("py-spy is not installed (pip install py-spy, or rlguard launch --py-spy)")
    if not process_exists(pid):
        return failed(f"process {pid} is gone")
    tries = [True] if _stopped(pid) else [False, True]
    proc = None
    for nonblocking in tries:
        left = timeout - (time.monotonic() - start)
        if left <= 0.05:
            break
        try:
            proc = _dump(py_spy, pid, nonblocking=nonblocking, timeout=left)
        except subprocess.TimeoutExpired:
            return failed(f"py-spy did not finish within {timeout:g}s")
        except OSError as exc:
            return failed(f"cannot run py-spy {py_spy}: {exc.strerror or exc}")
        if proc.returncode == 0 and proc.stdout.strip():
            text, cut = truncate(proc.stdout, max_bytes)
            return StackCapture(
                pid,
                True,
                text=text,
                truncated=cut,
                captured_at=started_at,
                duration_s=round(time.monotonic() - start, 3),
                nonblocking=nonblocking,
            )
        if not process_exists(pid):
            return failed(f"process {pid} is gone")
        if "ermission" in proc.stderr or "EPERM" in proc.stderr:
            break  # a second try is denied alike
    if proc is None:
        return failed(f"py-spy did not finish within {timeout:g}s")
    reason = _reason(proc)
    if "ermission" in proc.stderr or "EPERM" in proc.stderr:
        reason = (
            "ptrace denied (py-spy needs CAP_SYS_PTRACE or kernel.yama.ptrace_scope=0; "
            f"in a container --cap-add SYS_PTRACE): {reason}"
        )
    return failed(reason)
