"""Leases in real Redis and PostgreSQL for the checkpoint tests."""

from __future__ import annotations

from collections.abc import Callable

from recovery.checkpoint.lease import Lease

LeaseFactory = Callable[..., Lease]


def drop_redis_lease_keys(url: str, name: str) -> None:
    """Remove the keys a RedisLease named ``name`` left behind (lease, epoch, state)."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=2)
    try:
        keys = list(client.scan_iter(match=f"rlguard:lease:{name}*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()
