"""Where a launcher's processes run, and how a whole-job restart reaches the scheduler.

A backend is a module of this package with a module-level ``BACKEND`` (a :class:`Backend`);
:func:`load_backend` finds it by name. ``local`` runs the processes as children of the launcher
on this machine; a scheduler backend (Slurm) starts them the same way but hands a whole-job
restart to the scheduler (``scontrol requeue``) and can say what the scheduler thinks of this
node.
"""

from __future__ import annotations

import importlib
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

from recovery.errors import RecoveryError

# Backend names -> the module that holds its BACKEND.
_BACKEND_MODULES = {
    "local": "recovery.supervision.backends.local",
    "slurm": "recovery.supervision.backends.slurm",
}


class BackendError(RecoveryError):
    """The backend cannot run here (e.g. no scheduler); the message is one line for the user."""


@runtime_checkable
class Backend(Protocol):
    """What the supervisor needs from the place its processes run."""

    name: str

    def check(self) -> None:
        """Raise :class:`BackendError` if this backend cannot be used here."""
        ...

    def spawn(
        self, argv: list[str], *, env: Mapping[str, str], log_path: Path, cwd: Path | None
    ) -> subprocess.Popen[bytes]:
        """Start one process with ``argv`` and ``env``, its output appended to ``log_path``."""
        ...

    def kill(self, proc: subprocess.Popen[bytes], timeout: float) -> None:
        """End ``proc`` now (also when it is stopped) and reap it within ``timeout`` seconds."""
        ...

    def requeue_job(self, reason: str) -> bool:
        """Hand a whole-job restart to the scheduler; False when the supervisor restarts the
        processes itself (no scheduler)."""
        ...

    def node_state(self) -> str | None:
        """The scheduler's state of this node (e.g. ``IDLE``, ``DRAIN``); None without one."""
        ...


def known_backends() -> list[str]:
    """The names :func:`load_backend` accepts."""
    return sorted(_BACKEND_MODULES)


def load_backend(name: str) -> Backend:
    """The backend called ``name``; :class:`BackendError` names the known ones otherwise."""
    module_name = _BACKEND_MODULES.get(name)
    if module_name is None:
        raise BackendError(f"unknown backend {name!r} (known: {', '.join(known_backends())})")
    backend = getattr(importlib.import_module(module_name), "BACKEND", None)
    if not isinstance(backend, Backend):
        raise BackendError(f"{module_name} has no BACKEND object")
    return backend
