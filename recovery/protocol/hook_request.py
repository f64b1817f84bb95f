"""The launcher hook's command line: one recovery request, as the server's action worker
spells it and every launcher hook reads it.

``<hook> ACTION --job=J [--node=N] [--role=R] [--rank=K] [--away-from=N] --idempotency-key=KEY
[--extra=JSON] [--wait=S]``

Every value is joined to its option (``--job=VALUE``, one argv element): a value that looks like
an option (``-h``, ``--run-root=/x``) can then never be read as one, whatever parser a site's own
launcher uses (one exception: Python 3.11's argparse reads a value of exactly ``--`` as empty;
the server never sends one: keys are incident and action ids, roles match the heartbeat's rule).
A hook adds its own options (``--run-root``, the Ray hook's cluster options) with
:func:`add_request_arguments` beside them.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HookRequest", "add_request_arguments"]


@dataclass(frozen=True)
class HookRequest:
    """One request to a launcher hook."""

    action: str
    job: str
    idempotency_key: str
    node: str | None = None
    role: str | None = None
    rank: str | None = None
    away_from: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    wait: float | None = None  # seconds the hook waits for the launcher's answer

    def argv(self, hook: str) -> list[str]:
        """The command line that runs ``hook`` with this request."""
        argv = [hook, self.action, f"--job={self.job}"]
        for option, value in (
            ("--node", self.node),
            ("--role", self.role),
            ("--rank", self.rank),
            ("--away-from", self.away_from),
        ):
            if value is not None:
                argv.append(f"{option}={value}")
        argv.append(f"--idempotency-key={self.idempotency_key}")
        if self.extra:
            argv.append(f"--extra={json.dumps(self.extra, sort_keys=True)}")
        if self.wait is not None:
            argv.append(f"--wait={self.wait:g}")
        return argv


def add_request_arguments(p: argparse.ArgumentParser) -> None:
    """The request's options (not ``ACTION`` nor ``--wait``, whose defaults differ by hook), as
    every launcher hook parses them: the hooks differ in what they do with a request and in their
    own options, never in how a request is spelt."""
    p.add_argument("--job", required=True)
    p.add_argument("--node")
    p.add_argument("--role")
    p.add_argument("--rank")
    p.add_argument("--away-from")
    p.add_argument("--idempotency-key", required=True)
    p.add_argument("--extra")
