"""Fixtures for the policy integration tests: the real stack of ``tests/harness/stack.py``
(server process with the policy scheduler, Celery worker processes, agents) in both modes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import RedisServer
from tests.harness.stack import Stack, fast_policy


@pytest.fixture(params=["postgres+redis", "embedded"])
def stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    """The stack in both modes: PostgreSQL + Redis, and embedded (SQLite, SQLAlchemy broker)."""
    policy = fast_policy(tmp_path / "policy.yaml")
    redis = None
    if request.param == "postgres+redis":
        url = request.getfixturevalue("postgres_url")
        redis = request.getfixturevalue("own_redis")
    else:
        url = f"sqlite:///{tmp_path / 'rlguard.db'}"
    s = Stack(tmp_path, database_url=url, redis=redis, policy=policy)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(params=["embedded", "postgres+redis"])
def any_stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    """The same in the other order (embedded first)."""
    if request.param == "embedded":
        yield request.getfixturevalue("embedded_stack")
        return
    yield request.getfixturevalue("redis_stack")


@pytest.fixture
def redis_stack(tmp_path: Path, postgres_url: str, own_redis: RedisServer) -> Iterator[Stack]:
    """PostgreSQL and a Redis of the test's own."""
    s = Stack(
        tmp_path,
        database_url=postgres_url,
        redis=own_redis,
        policy=fast_policy(tmp_path / "policy.yaml"),
    )
    try:
        yield s
    finally:
        s.close()
