"""Each node's share of the server's ingest CPU time, so that no node crowds the others out.

The quotas (``app.ingest.quotas``) bound what a node may *create*; this bounds what its batches
may *cost* on the server's one event loop, where every other node's request waits meanwhile.
Each node has a token bucket of loop CPU seconds: ``ingest_cpu_share`` of one core sustained,
``ingest_cpu_burst_seconds`` at once. What validating and applying a batch took on the loop
thread is charged to its node afterwards, as thread CPU time (a descheduled server charges
nobody); a refused batch is charged ``REFUSED_FACTOR`` times that. A request of a node in debt
is answered 429 with ``Retry-After`` before its body is read, in O(1): nothing of it is read,
stored or counted as seen, and the agent retries the same batch later. So a node's batches take
at most its share of the loop plus its burst, and its refused requests cost next to nothing.
The figures behind the defaults: ``docs/performance.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# What a refused batch's CPU time counts for (see the module docstring): with the defaults a
# node whose every batch is refused gets ~0.5% of a core for them, not 2%.
REFUSED_FACTOR = 4.0
_NANO = 1e-9


@dataclass(slots=True)
class CpuBucket:
    """One node's CPU budget: ``tokens`` seconds left at monotonic time ``at`` (negative: debt)."""

    tokens: float
    at: float


class CpuShare:
    """The buckets' arithmetic (the caller, ``NodeQuotas``, holds the lock and the buckets)."""

    def __init__(self, share: float, burst_seconds: float) -> None:
        self.share = share  # CPU seconds a node earns per second: its fraction of a core
        self.burst = burst_seconds

    def new_bucket(self, now: float) -> CpuBucket:
        return CpuBucket(tokens=self.burst, at=now)

    def refill(self, bucket: CpuBucket, now: float) -> float:
        """The bucket's tokens at ``now`` (stored back: refills are never counted twice)."""
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) * self.share)
        bucket.at = now
        return bucket.tokens

    def wait(self, bucket: CpuBucket, now: float) -> int:
        """Whole seconds until the node may send again; 0 when it may now (out of debt)."""
        debt = -self.refill(bucket, now) - _NANO  # float sums: 1e-17 s owed is paid
        if debt <= 0.0:
            return 0
        return max(1, math.ceil(debt / self.share))

    def charge(self, bucket: CpuBucket, seconds: float, now: float, *, refused: bool) -> None:
        self.refill(bucket, now)
        bucket.tokens -= seconds * REFUSED_FACTOR if refused else seconds

    def spent(self, bucket: CpuBucket, now: float) -> float:
        """Seconds of the burst in use now (more than the burst: in debt)."""
        return self.burst - self.refill(bucket, now)
