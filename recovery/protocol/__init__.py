"""The contracts between RLGuard's processes, each declared once, in the layer every side may
import (the server, the agents, the integrations and the jobs all import :mod:`recovery`):

- :mod:`recovery.protocol.hook_request`: the launcher hook's command line, built by the server's
  action worker and parsed by every hook (``rlguard launch``'s, the reference job's, Ray's);
- :mod:`recovery.protocol.metric_names`: the metric names on the wire, what the agents send and
  what the policy engine reads;
- :mod:`recovery.protocol.heartbeat`: the heartbeat document as the node agent reads it (written
  by :class:`recovery.report.HeartbeatReporter` and the launcher's exit reports);
- :mod:`recovery.protocol.samples`: the ingest batch, its samples and participants, as the agents
  send them and the server's validators decode them.

A test pins each contract (``tests/unit/recovery/protocol/``): a renamed option fails there, not
on a node at 3 a.m.
"""

__all__: list[str] = []  # the contracts are its modules
