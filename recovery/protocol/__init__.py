"""The contracts between RLGuard's processes, each declared once, in the layer every side may
import (the server, the agents, the integrations and the jobs all import :mod:`recovery`):

- :mod:`recovery.protocol.hook_request`: the launcher hook's command line, built by the server's
  action worker and parsed by every hook (``rlguard launch``'s, the reference job's, Ray's).

A test pins each contract (``tests/unit/recovery/protocol/``): a renamed option fails there, not
on a node at 3 a.m.
"""

__all__: list[str] = []  # the contracts are its modules
