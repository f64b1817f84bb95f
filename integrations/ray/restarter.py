"""The restarter protocol: how a Ray job lets RLGuard create its dead actors again.

Ray restarts an actor whose process died only when the actor was created with
``max_restarts``; verl creates its workers without, so a dead worker stays DEAD and
``ray.kill`` cannot revive it. A job (its single controller) that wants RLGuard to decide on
such restarts registers a named actor, ``rlguard_restarter_<job>`` in the namespace of its
actors, with one method::

    restart_role(role: str, rank: int, key: str) -> dict

which creates the role's actor again, starts its work, and answers a JSON-able dict (``name``, ``actor_id``...). It must be
idempotent on ``key`` (RLGuard's idempotency key): a second delivery of the same action creates
nothing and answers the first answer with ``already: true``. Ray keeps a dead named actor's
name taken while its owner lives, so the new actor needs a name of its own that the job's
preset maps to the same role and rank (the mapping then leaves the dead one out once the new
one is created). The restarter may keep that next actor ready as a warm standby: created ahead,
its constructor waiting until ``restart_role`` activates it; while it waits Ray reports it
``PENDING_CREATION``, which the mapping takes as nobody's replacement. The launcher hook
(:mod:`integrations.ray.hook`) asks it for a DEAD actor instead of refusing; the reference
job's Ray mode (``workload.ray_mode``, ``--ray-restart-by rlguard``) provides one.
"""

from __future__ import annotations

RESTARTER_PREFIX = "rlguard_restarter_"


def restarter_name(job: str) -> str:
    """The name of ``job``'s restarter actor."""
    return f"{RESTARTER_PREFIX}{job}"
