"""The real stack's fixtures, shared with the policy integration tests (one definition)."""

from __future__ import annotations

from tests.integration.policy.conftest import redis_stack

__all__ = ["redis_stack"]
