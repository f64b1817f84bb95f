"""The exit-cause catalogue as the policy engine reads it: each cause's fault kind, tier and plan.

The catalogue itself is a data file shared with the launcher
(``recovery/supervision/exit_causes.yaml``, loaded by :mod:`recovery.supervision.exit_causes`,
which checks its structure, patterns and kinds). Here each row is also checked against the
server's own vocabulary (a :class:`FaultKind`, a :class:`Tier`, :class:`ActionName` values),
so a catalogue the policy could not act on stops the server at start with the row's line.
A policy file may override a cause's rule (``exit_causes:`` in ``policy.yaml``); a cause the
server's catalogue does not list (a launcher given its own ``--exit-causes`` file) is judged
by the ``tiers`` rule of the kind it reports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.policy.plans import ActionName
from app.policy.signals import FaultKind, Tier
from recovery.supervision.exit_causes import CatalogueError, load_catalogue


class ExitCauseCatalogueError(ValueError):
    """The catalogue cannot be used by the server; the message names its file and line."""


def catalogue_rules(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """Per cause: its ``kind``, ``tier`` and ``plan`` from the catalogue at ``path`` (default:
    the shipped one), checked against the server's vocabulary."""
    try:
        catalogue = load_catalogue(path)
    except CatalogueError as exc:
        raise ExitCauseCatalogueError(str(exc)) from None
    kinds, tiers, actions = set(FaultKind), set(Tier), set(ActionName)
    out: dict[str, dict[str, Any]] = {}
    for row in catalogue.rows:
        where = f"exit-cause catalogue {catalogue.path}, line {row.line}"
        if row.kind not in kinds:
            raise ExitCauseCatalogueError(f"{where}: kind {row.kind!r} is not a fault kind")
        if row.tier not in tiers:
            raise ExitCauseCatalogueError(f"{where}: tier {row.tier!r} is not a tier")
        unknown = [a for a in row.plan if a not in actions]
        if unknown:
            raise ExitCauseCatalogueError(
                f"{where}: plan of {row.cause!r} names unknown action {unknown[0]!r} "
                f"(known: {', '.join(sorted(a.value for a in ActionName))})"
            )
        out[row.cause] = {"kind": row.kind, "tier": row.tier, "plan": list(row.plan)}
    return out
