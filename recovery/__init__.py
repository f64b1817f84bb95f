"""RLGuard's embedded recovery library.

Linked into training code (trainer ranks, rollout workers). Imports torch, never FastAPI,
SQLModel or Celery, and reads no environment variables: everything is an explicit argument.
"""

from recovery.errors import RecoveryError, RecoveryTimeout

__all__ = ["RecoveryError", "RecoveryTimeout"]
