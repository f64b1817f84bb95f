from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from recovery.checkpoint.lease import Lease, PostgresLease, RedisLease
from tests.integration.checkpoint._lease import LeaseFactory, drop_redis_lease_keys


@pytest.fixture(params=["redis", "postgres"])
def lease_factory(request: pytest.FixtureRequest) -> Iterator[LeaseFactory]:
    """Makes leases on one name in real Redis or real PostgreSQL (each test its own name)."""
    name = f"ckpt-test-{uuid.uuid4().hex[:10]}"
    made: list[Lease] = []
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")

        def make(ttl: float = 2.0, timeout: float = 1.0) -> Lease:
            lease = RedisLease(url, name=name, ttl=ttl, timeout=timeout)
            made.append(lease)
            return lease
    else:
        dsn = request.getfixturevalue("postgres_url")

        def make(ttl: float = 2.0, timeout: float = 1.0) -> Lease:
            lease = PostgresLease(dsn, name=name, ttl=ttl, timeout=timeout)
            made.append(lease)
            return lease

    yield make
    for lease in made:
        lease.close()
    if request.param == "redis":
        drop_redis_lease_keys(url, name)
