"""How an action's adapter says it failed: for good, or for now."""

from __future__ import annotations


class ActionError(Exception):
    """The action cannot succeed as things are (counts as a failed local recovery)."""


class TransientActionError(Exception):
    """Worth retrying with backoff (a lock held, a hook that timed out)."""
