"""The root of the recovery library's exception tree.

Every error the library raises derives from :class:`RecoveryError`, so training code can catch
the library's failures without catching its own bugs. Each module defines its own subclasses
(``WALError``, ``CheckpointError``, ``TransferError`` ...) beside the code that raises them.
"""

from __future__ import annotations


class RecoveryError(Exception):
    """Base class of every error raised by :mod:`recovery`."""


class RecoveryTimeout(RecoveryError, TimeoutError):
    """A blocking call of the library ran past its ``timeout``."""
