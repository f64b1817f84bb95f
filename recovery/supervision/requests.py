"""The launcher hook's protocol: how RLGuard's recovery worker asks a node's launcher to act.

The worker runs the executable named by ``RLGUARD_RECOVERY_LAUNCHER`` as
``<hook> <action> --job=J [--node=N] [--role=R] [--rank=K] --idempotency-key=KEY [--extra=JSON]``
(``app.tasks.recovery_adapters``). The hook (:func:`submit`) leaves the request as
``<run_dir>/recovery/launcher/<digest of KEY>.json`` and waits; the launcher's supervisor
(:func:`pending`, :func:`answer`) carries it out and writes ``<digest>.done`` with ``ok`` and
what it did. A key answered already is answered again without acting: a request is carried out
once however often the worker retries it.

A withdrawn request (:func:`withdraw`) and the launcher both *claim* it (:func:`claim`,
``<digest>.taken`` created with ``O_EXCL``), so exactly one wins; only actions that must never
run late claim (``inject_fault``). Each running launcher says so in
``<run_dir>/recovery/launchers/<pid>.json`` with its roles: with none running a request is
refused at once, and with one launcher per role a request for a role is carried out by the one
that runs it (:func:`runs_elsewhere`). A job-wide request (``restart_job``) is carried out by the
first launcher that takes it, for its own processes only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recovery.errors import RecoveryError, RecoveryTimeout
from recovery.fsio import write_json_atomic
from recovery.pids import process_exists

HOOK_ACTIONS = (
    "capture_stacks",  # hang forensics, asked for before restart_role (read-only)
    "restart_role",
    "restart_job",
    "reschedule_batches",
    "restore_checkpoint",
    "drain_node",
    "inject_fault",  # rlguard drill: a fault on purpose (recovery.supervision.drills)
)
KEY_PATTERN = re.compile(r"[\x21-\x7e]{1,300}")  # printable ASCII, no spaces
JOB_DIR_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # a job that names a directory


class LauncherError(RecoveryError):
    """The request could not be delivered (no launcher running, bad request)."""


class LauncherTimeout(LauncherError, RecoveryTimeout):
    """The launcher did not answer within the wait."""


def requests_dir(run_dir: Path) -> Path:
    """Where requests to the launcher of ``run_dir`` wait."""
    return run_dir / "recovery" / "launcher"


def launchers_dir(run_dir: Path) -> Path:
    """Where the running launchers of ``run_dir`` say so, one file each (``<pid>.json``)."""
    return run_dir / "recovery" / "launchers"


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None  # missing, or being replaced right now: the next read sees the whole file
    return data if isinstance(data, dict) else None


def announce(run_dir: Path, **fields: Any) -> None:
    """Record that a launcher of ``run_dir`` runs in this process (call once at its start);
    ``roles``: the roles of the processes it runs (a job may run one launcher per role)."""
    requests_dir(run_dir).mkdir(parents=True, exist_ok=True)
    launchers_dir(run_dir).mkdir(parents=True, exist_ok=True)
    write_json_atomic(
        launchers_dir(run_dir) / f"{os.getpid()}.json",
        {"pid": os.getpid(), "started_at": time.time(), **fields},
    )


def retire(run_dir: Path) -> None:
    """Say that this process's launcher of ``run_dir`` stopped (the others go on)."""
    (launchers_dir(run_dir) / f"{os.getpid()}.json").unlink(missing_ok=True)


def live_launchers(run_dir: Path) -> list[dict[str, Any]]:
    """What the running launchers of ``run_dir`` announced (one that died is left out)."""
    out = []
    for path in sorted(launchers_dir(run_dir).glob("*.json")):
        body = _read(path)
        try:
            pid = int((body or {})["pid"])
        except (KeyError, TypeError, ValueError):
            continue
        if body is not None and process_exists(pid):
            out.append(body)
    return out


def _launcher_alive(run_dir: Path) -> bool:
    return bool(live_launchers(run_dir))


# Actions addressed to one role: with one launcher per role, the launcher running it acts.
ROLE_ACTIONS = ("restart_role", "capture_stacks", "reschedule_batches")


def for_another_launcher(run_dir: Path, body: dict[str, Any], *, runs_it: bool) -> bool:
    """Whether a launcher that does not run the role a request names (``runs_it``) leaves it
    to another running launcher of the job that does."""
    role = body.get("role")
    return (
        not runs_it
        and body.get("action") in ROLE_ACTIONS
        and isinstance(role, str)
        and runs_elsewhere(run_dir, role)
    )


def runs_elsewhere(run_dir: Path, role: str) -> bool:
    """Whether another running launcher of ``run_dir`` runs processes of ``role``: a request for
    that role is its to carry out (a job with one launcher per role, e.g. a trainer under one
    ``rlguard launch`` and its inference engine under another)."""
    me = os.getpid()
    return any(
        body.get("pid") != me and role in (body.get("roles") or [])
        for body in live_launchers(run_dir)
    )


@dataclass(frozen=True)
class Request:
    """One request file the supervisor has not answered yet."""

    path: Path
    body: dict[str, Any]

    @property
    def action(self) -> Any:
        return self.body.get("action")


def request_name(key: str) -> str:
    # Keys carry '/' and ':' (inc2/s0/restart_job:job): a digest makes a safe, stable file name.
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def submit(
    run_dir: Path, body: dict[str, Any], *, key: str, timeout: float, poll: float = 0.05
) -> dict[str, Any]:
    """Leave ``body`` for the launcher of ``run_dir`` under ``key`` and return its answer.

    Raises :class:`LauncherError` when no launcher runs there, :class:`LauncherTimeout` when
    it did not answer within ``timeout`` seconds (the request stays: asking again with the same
    key waits for the same answer).
    """
    if not KEY_PATTERN.fullmatch(key):
        raise LauncherError(f"idempotency key {key!r} must be 1-300 printable ASCII characters")
    directory = requests_dir(run_dir)
    name = request_name(key)
    req, done = directory / f"{name}.json", directory / f"{name}.done"
    if not done.exists():
        if not _launcher_alive(run_dir):
            raise LauncherError(f"no launcher is running for {run_dir}")
        if not req.exists():
            write_json_atomic(req, {**body, "key": key, "ts": time.time()})
        deadline = time.monotonic() + timeout
        while not done.exists():
            if time.monotonic() > deadline:
                raise LauncherTimeout(f"the launcher did not answer within {timeout:g}s")
            time.sleep(poll)
    answer = None
    while answer is None:  # written atomically: absent or whole, never torn
        answer = _read(done)
    return answer


WITHDRAWN = "withdrawn"
LAUNCHER = "launcher"


def _taken_path(request_path: Path) -> Path:
    return request_path.with_suffix(".taken")


def _create_once(path: Path, who: str) -> str | None:
    """Create ``path`` holding ``who`` unless it exists; None when created, else who holds it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        for _ in range(100):  # created, not written yet: the writer is one call away
            holder = path.read_text(encoding="utf-8").strip()
            if holder:
                return holder
            time.sleep(0.01)
        return "unknown"
    try:
        os.write(fd, who.encode())
    finally:
        os.close(fd)
    return None


def claim(request: Request) -> str | None:
    """Take ``request`` for the launcher before acting on it: None when this call took it,
    else who had (``withdrawn``: its requester gave up; ``launcher``: an earlier launcher took
    it and may have acted before it stopped)."""
    return _create_once(_taken_path(request.path), LAUNCHER)


def withdraw(run_dir: Path, key: str, *, why: str) -> dict[str, Any]:
    """Withdraw the request under ``key`` unless the launcher took it first.

    ``{"withdrawn": True}``: it will never be carried out (answered ``ok: false, withdrawn``,
    its file removed; a later :func:`submit` of the key gets that answer). Otherwise
    ``{"withdrawn": False, "answer": ...}`` when the launcher answered, or
    ``{"withdrawn": False, "taken": True}`` while it is carrying it out (its answer follows).
    """
    if not KEY_PATTERN.fullmatch(key):
        raise LauncherError(f"idempotency key {key!r} must be 1-300 printable ASCII characters")
    directory = requests_dir(run_dir)
    req = directory / f"{request_name(key)}.json"
    directory.mkdir(parents=True, exist_ok=True)
    holder = _create_once(_taken_path(req), WITHDRAWN)
    if holder is None or holder == WITHDRAWN:
        if holder is None:  # answer first, then remove: a submit in between reads the answer
            write_json_atomic(
                req.with_suffix(".done"),
                {"key": key, "ok": False, "withdrawn": True, "error": why, "done_at": time.time()},
            )
            req.unlink(missing_ok=True)
        return {"withdrawn": True}
    answer = _read(req.with_suffix(".done"))
    return {"withdrawn": False, "answer": answer} if answer else {"withdrawn": False, "taken": True}


def pending(run_dir: Path) -> list[Request]:
    """Unanswered requests, oldest name first (names are digests: order is not meaningful)."""
    out = []
    for path in sorted(requests_dir(run_dir).glob("*.json")):
        body = _read(path)
        if body is not None:
            out.append(Request(path, body))
    return out


def answer(request: Request, result: dict[str, Any]) -> None:
    """Write the answer to ``request`` and remove it (answer first: a crash in between leaves
    an answered request, which the next supervisor answers again without acting)."""
    write_json_atomic(
        request.path.with_suffix(".done"), {**request.body, **result, "done_at": time.time()}
    )
    request.path.unlink(missing_ok=True)


def answered(request: Request) -> bool:
    """Whether ``request`` was answered already (its key was carried out before)."""
    return request.path.with_suffix(".done").exists()
