"""Errors of the checkpoint engine, the coordinator, the leader lease and the restore procedure.

All derive from :class:`recovery.errors.RecoveryError`, so training code can catch the library's
failures in one place without catching its own bugs.
"""

from __future__ import annotations

from recovery.errors import RecoveryError


class CheckpointError(RecoveryError):
    """Base class of every checkpoint-related failure."""


class CheckpointInputError(CheckpointError, ValueError):
    """A caller passed a bad argument; nothing was written or changed."""


class CheckpointCorrupt(CheckpointError):
    """A checkpoint on disk failed verification (missing marker, bad checksum, truncated file)."""


class CheckpointBusy(CheckpointError):
    """A save was refused because the previous one is still being written."""


class CheckpointWriteError(CheckpointError):
    """The background writer failed; the checkpoint was not committed."""


class CoordinatorError(CheckpointError):
    """A coordinator or participant call failed (protocol error, unreachable peer, not leader)."""


class LeaseError(CheckpointError):
    """The leadership lease backend could not be reached or answered something unexpected."""


class RestoreError(CheckpointError):
    """The recovery procedure could not bring the participants back to one consistent point."""
