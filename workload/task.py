"""The reference job's task dimensions, without torch.

:class:`TaskSpec` lives here rather than in :mod:`workload.policy` so that what only reads the
job's configuration (the launcher hook, which the recovery worker starts for every action) does
not pay for importing torch: that import alone costs seconds on a busy machine, on the recovery
path.
"""

from __future__ import annotations

from dataclasses import dataclass

DIGITS = 10


@dataclass(frozen=True)
class TaskSpec:
    length: int = 4
    group_size: int = 8
    prompts_per_worker: int = 4
    hidden: int = 64

    @property
    def max_sum(self) -> int:
        return (DIGITS - 1) * self.length
