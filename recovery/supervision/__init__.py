"""Node-side supervision of a training job's processes (the launcher's library).

* :mod:`~recovery.supervision.supervisor`: :class:`Supervisor`, which runs the processes,
  writes their exits into their heartbeats and carries out RLGuard's restart requests;
* :mod:`~recovery.supervision.requests`: the launcher hook's request/answer protocol;
* :mod:`~recovery.supervision.restarts`: the restart budget and backoff;
* :mod:`~recovery.supervision.standby`: warm standby processes;
* :mod:`~recovery.supervision.backends`: where the processes run (``local``; a scheduler);
* :mod:`~recovery.supervision.events`: the launcher's timeline.

Like the rest of :mod:`recovery` it takes explicit arguments and reads no environment
variables; the command lines (``rlguard launch``, ``python -m workload.launch``) do that.
"""

from __future__ import annotations

from recovery.supervision.backends import Backend, BackendError, load_backend
from recovery.supervision.restarts import RestartBudget, RestartBudgetError
from recovery.supervision.standby import Order, OrderError, StandbyPool
from recovery.supervision.supervisor import Child, Supervisor

__all__ = [
    "Backend",
    "BackendError",
    "Child",
    "Order",
    "OrderError",
    "RestartBudget",
    "RestartBudgetError",
    "StandbyPool",
    "Supervisor",
    "load_backend",
]
