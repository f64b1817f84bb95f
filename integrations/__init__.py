"""Framework integrations: what RLGuard needs to know about a training framework.

An integration answers two questions for the launcher (:mod:`integrations.launch`):
``check_environment()`` (can this framework run under RLGuard here? else
:class:`IntegrationError` with one line the user can act on) and ``resume_argv(argv)`` (the
command for a restart: ``argv`` with the framework's resume arguments pointing at the newest
*complete* checkpoint, or unchanged when there is none). It may also name ``preload_modules``
(what a warm standby imports ahead) and ``standby_warmup`` (``"MODULE:FUNCTION"`` names the
standby calls before it waits, leaving the run's results unchanged). Each framework is a module
with a module-level ``INTEGRATION`` and its own optional extra (``rlguard[trl]``), imported only
when asked for.

Each child process gets ``RLGUARD_JOB``, ``RLGUARD_ROLE``, ``RLGUARD_RUN_DIR``, ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE`` (and ``MASTER_ADDR`` / ``MASTER_PORT`` when the launcher starts
several ranks, or a world of one that has none) and writes its heartbeat to
``<run_dir>/heartbeat/<role>-<rank>.json`` (:class:`recovery.report.HeartbeatReporter`); the
launcher writes phase ``EXITED`` there when it exits. This package imports :mod:`recovery` and
its frameworks, never :mod:`app`.
"""

from __future__ import annotations

import importlib
from typing import Protocol, runtime_checkable

# The environment variables the launcher sets for each child (see the module docstring).
ENV_JOB = "RLGUARD_JOB"
ENV_ROLE = "RLGUARD_ROLE"
ENV_RUN_DIR = "RLGUARD_RUN_DIR"

# Integrations by name -> the module that holds its ``INTEGRATION``; "none" is built in.
_FRAMEWORK_MODULES = {"trl": "integrations.trl"}


class IntegrationError(Exception):
    """The integration cannot run here; the message is one clear line for the user."""


@runtime_checkable
class Integration(Protocol):
    """What the launcher asks of a framework integration."""

    name: str

    def check_environment(self) -> None:
        """Raise :class:`IntegrationError` if the framework cannot run under RLGuard here."""
        ...

    def resume_argv(self, argv: list[str]) -> list[str]:
        """``argv`` with the framework's resume arguments pointing at the newest complete
        checkpoint; ``argv`` unchanged when there is none."""
        ...


class GenericIntegration:
    """No framework: nothing to check, a restart runs the same command again."""

    name = "none"
    preload_modules: tuple[str, ...] = ()
    standby_warmup: tuple[str, ...] = ()

    def check_environment(self) -> None:
        return None

    def resume_argv(self, argv: list[str]) -> list[str]:
        return list(argv)


def known_integrations() -> list[str]:
    """The names :func:`load_integration` accepts."""
    return ["none", *sorted(_FRAMEWORK_MODULES)]


def load_integration(name: str) -> Integration:
    """The integration called ``name``; its framework module is imported only now.

    ``name`` is one of :func:`known_integrations`, or the dotted name of a module of your own
    with an ``INTEGRATION`` object (``mypkg.rlguard_integration``), for a framework RLGuard does
    not ship.
    """
    if name == "none":
        return GenericIntegration()
    module_name = _FRAMEWORK_MODULES.get(name)
    if module_name is None and "." not in name:
        raise IntegrationError(
            f"unknown integration {name!r} (known: {', '.join(known_integrations())}, "
            f"or a module path with an INTEGRATION object)"
        )
    try:
        module = importlib.import_module(module_name or name)
    except ImportError as exc:
        if module_name is None:
            raise IntegrationError(f"cannot import integration module {name!r}: {exc}") from exc
        raise IntegrationError(
            f"integration {name!r} needs its extra: pip install 'rlguard[{name}]' ({exc})"
        ) from exc
    module_name = module.__name__
    integration = getattr(module, "INTEGRATION", None)
    if not isinstance(integration, Integration):
        raise IntegrationError(f"{module_name} has no INTEGRATION object")
    return integration
