"""Errors raised by the weight-transfer package.

All derive from :class:`TransferError`, itself a :class:`recovery.errors.RecoveryError`, so the
training loop can tell "the transfer failed" apart from its own bugs and decide what to do (switch
source, stay on the previous version, escalate).
"""

from __future__ import annotations

from recovery.errors import RecoveryError, RecoveryTimeout


class TransferError(RecoveryError):
    """Base class of every weight-transfer failure."""


class TransferConfigError(TransferError, ValueError):
    """A transfer was configured or called with a bad value (named in the message)."""


class RegistryProtocolError(TransferConfigError):
    """The registry server speaks an older protocol than this client needs (upgrade it)."""


class TransportUnavailableError(TransferError):
    """The selected transport cannot run here (for example ``ucx`` without ``ucxx`` installed)."""


class ProtocolError(TransferError):
    """A peer sent something that does not follow the transfer protocol."""


class PeerDeadError(TransferError):
    """The peer closed or reset the connection, or could not be reached at all."""

    def __init__(self, address: str, detail: str) -> None:
        super().__init__(f"peer {address} is dead or unreachable: {detail}")
        self.address = address


class TransferTimeout(PeerDeadError, RecoveryTimeout):
    """A blocking transfer call ran past its timeout (a hung peer is treated as a dead one)."""


class ChunkChecksumError(TransferError):
    """A chunk's bytes do not match the checksum the publisher recorded in the manifest."""

    def __init__(self, chunk_index: int, expected: int, actual: int, source: str) -> None:
        super().__init__(
            f"chunk {chunk_index} from {source} has checksum {actual:#010x}, "
            f"manifest says {expected:#010x}"
        )
        self.chunk_index = chunk_index
        self.source = source


class ManifestMismatchError(TransferError, ValueError):
    """A manifest does not fit the receiver's preallocated tensors or the registry's record."""


class NonContiguousTensorError(TransferError, ValueError):
    """A non-contiguous tensor was offered for sending while the policy is to refuse them."""


class VersionDiscardedError(TransferError):
    """The version was aborted (its publisher died before committing it) and is discarded."""


class UnknownVersionError(TransferError, LookupError):
    """No source or registry knows the requested weight-set version."""


class NoSourceError(TransferError):
    """No live source is left to pull a version from."""
