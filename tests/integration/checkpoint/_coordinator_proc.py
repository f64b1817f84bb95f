"""A coordinator process for the leader-failover tests.

Usage: ``python -m tests.integration.checkpoint._coordinator_proc ID BACKEND URL LEASE TTL PORT``
(BACKEND ``redis`` or ``postgres``). Prints ``url <url>`` once serving, then runs until killed.
"""

from __future__ import annotations

import signal
import sys

from recovery.checkpoint.coordinator import Coordinator
from recovery.checkpoint.lease import Lease, PostgresLease, RedisLease


def main() -> None:
    cid, backend, url, name, ttl, port = sys.argv[1:7]
    lease: Lease
    if backend == "redis":
        lease = RedisLease(url, name=name, ttl=float(ttl), timeout=0.5)
    else:
        lease = PostgresLease(url, name=name, ttl=float(ttl), timeout=0.5)
    coord = Coordinator(
        coordinator_id=cid,
        lease=lease,
        port=int(port),
        round_timeout=2.0,
        request_timeout=1.0,
        checkpoint_interval_steps=None,
        suspect_after=1.0,
        confirm_after=2.0,
    )
    coord.start()
    print(f"url {coord.url}", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    coord.close()


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    main()
