"""The real stack's fixtures, shared with the policy integration tests (one definition)."""

from __future__ import annotations

from tests.integration.policy.conftest import own_redis, redis_stack

__all__ = ["own_redis", "redis_stack"]
