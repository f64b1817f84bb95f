"""Each node's share of the server's ingest CPU time, so that no node crowds the others out.

The quotas (``app.ingest.quotas``) bound what a node may *create*; this bounds what its batches
may *cost*. Ingest runs on the server's one event loop: while it decodes and checks one node's
batch, every other node's request waits. A node staying under its request rate and sending
5,000 new series per batch was refused by the quotas every time, yet each refusal still took
~7 ms of the loop (decoding the batch and counting its new series, to say how many and when to
retry), ~13 times a second: the calm node's ingest p99 doubled (issue 41, benchmarks/flood.py).

So each node has a token bucket of loop CPU seconds: ``ingest_cpu_share`` of one core
sustained, ``ingest_cpu_burst_seconds`` at once. What validating and applying a node's batch
took on the loop thread is charged to the node afterwards (its cost is known only then), as
thread CPU time: a server descheduled by a busy machine charges nobody for the wait. A request
of a node in debt is answered 429 with ``Retry-After`` before its body is read, in O(1): nothing
of it is read, stored or counted as seen, and the agent retries the same batch later as after
any 429. So a node's batches can take at most its share of the loop (plus its burst), whatever
they hold, and its refused requests cost next to nothing.

A refused batch is charged ``REFUSED_FACTOR`` times what it took: its work stored nothing for
anyone, and a node whose batches are refused over and over (a flood, a misconfigured agent) gets
that much less of the loop for them, while an ordinary node, whose batches pass, never notices.

An 8-GPU node's agent (a batch of ~500 known samples a second, ~0.6 ms) uses well under 1% of a
core; the default share is 2%. The default burst is 0.1 s: a batch is charged after it ran, so
a node not in debt passes with a batch of any size (a fresh agent's first batch of 5,000 new
series, ~70 ms, passes and leaves it ~0.03 s); the burst only decides how much more work may
follow at once. With 0.25 s a flooding node had 5-10 refused 5,000-sample batches decoded on
the loop (10-60 ms each on the loaded 2-core machine) in the first 1.5 s of its flood, right
after its accepted first batch, and the calm node's requests waited behind them
(``benchmarks/flood.py``); with 0.1 s one or two.
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
