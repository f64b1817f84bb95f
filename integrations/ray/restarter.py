"""The restarter protocol: how a Ray job lets RLGuard create its dead actors again.

Ray restarts an actor whose process died only when it was created with ``max_restarts``. A job
(its single controller) that wants RLGuard to decide on such restarts registers a named actor,
``rlguard_restarter_<job>`` in its actors' namespace, with one method::

    restart_role(role: str, rank: int, key: str) -> dict

which creates the role's actor again, starts its work and answers a JSON-able dict (``name``,
``actor_id``...). It must be idempotent on ``key`` (RLGuard's idempotency key): a second
delivery creates nothing and answers the first answer with ``already: true``. The new actor
needs a name of its own (Ray keeps a dead actor's name taken) that the job's preset maps to the
same role and rank. A warm standby may be created ahead, its constructor waiting until
``restart_role`` activates it (Ray reports it ``PENDING_CREATION``: nobody's replacement). The
launcher hook (:mod:`integrations.ray.hook`) asks it for a DEAD actor instead of refusing.
"""

from __future__ import annotations

RESTARTER_PREFIX = "rlguard_restarter_"


def restarter_name(job: str) -> str:
    """The name of ``job``'s restarter actor."""
    return f"{RESTARTER_PREFIX}{job}"
