"""The :class:`Transport` interface that tcp, shm and ucx implement.

A transport knows how to listen, connect and move bytes; the protocol (manifest first, then
checksummed chunks), source selection and failover live above it and are shared by all three.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol

import torch

from recovery.transfer.copy_digest import CopyDigest
from recovery.transfer.errors import TransferConfigError
from recovery.transfer.manifest import TensorSpec, allocate
from recovery.transfer.store import Buffers
from recovery.transfer.wire import Channel


class Listener(Protocol):
    """A listening endpoint; ``address`` is what peers pass to :meth:`Transport.connect`."""

    address: str

    def close(self) -> None:
        """Stop accepting and drop open connections."""
        ...


class PayloadReader(Protocol):
    """Reads chunk bytes that do not travel on the channel (shared memory)."""

    def read_into(self, dest: memoryview, tensor: str, offset: int) -> None:
        """Copy ``len(dest)`` bytes of ``tensor`` starting at byte ``offset`` into ``dest``."""
        ...

    def read_and_digest(
        self, dest: memoryview, tensor: str, offset: int, copy_digest: CopyDigest
    ) -> int:
        """Copy like :meth:`read_into` with ``copy_digest``; returns the checksum of ``dest``."""
        ...

    def close(self) -> None:
        """Unmap what was mapped."""
        ...


ConnectionHandler = Callable[[Channel], None]


class Transport(ABC):
    """Moves weight-set bytes between processes; chosen by name in :func:`make_transport`."""

    name: ClassVar[str]
    #: True when chunk bytes follow their header on the channel; False when they are read
    #: through :meth:`open_payload` (the header then only says the chunk is ready).
    inline_payload: ClassVar[bool] = True
    #: Threads a receiver verifies chunks on (its default): one beside the receiving thread.
    verify_threads: ClassVar[int] = 1
    #: True when a send may be split into several sends (a byte stream); message transports
    #: (ucx) need each send matched by one receive of the same size, so payloads go whole.
    stream_oriented: ClassVar[bool] = True

    @abstractmethod
    def listen(self, host: str, port: int, handler: ConnectionHandler) -> Listener:
        """Accept connections on ``host:port`` (0 = any free port), one handler call each."""

    @abstractmethod
    def connect(self, address: str, *, timeout: float) -> Channel:
        """Open a channel to ``address``; raises PeerDeadError when nobody answers in time."""

    def allocate(self, specs: Sequence[TensorSpec], *, tag: str) -> Buffers:
        """Preallocated tensors a receiver writes into and can later serve from as a relay."""
        return Buffers(allocate(specs))

    def adopt(self, tensors: Mapping[str, torch.Tensor], *, tag: str) -> Buffers:
        """Serve a publisher's contiguous tensors (no copy unless the transport needs one)."""
        return Buffers(dict(tensors))

    def adopt_digested(
        self, tensors: Mapping[str, torch.Tensor], *, tag: str, chunk_bytes: int, checksum: str
    ) -> tuple[Buffers, list[int] | None]:
        """:meth:`adopt`, and the checksums of the served bytes' chunks (cut as
        :func:`~recovery.transfer.manifest.build_manifest` cuts them) when the transport takes
        them in the same pass as its copy; None: the manifest checksums them itself."""
        return self.adopt(tensors, tag=tag), None

    def open_payload(self, extra: Mapping[str, Any]) -> PayloadReader | None:
        """For transports whose chunk bytes do not travel on the channel."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook: most transports hold nothing
        """Release transport-wide resources."""


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` → (host, port), with a clear error for anything else."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise TransferConfigError(f"address must look like 'host:port', got {address!r}")
    return host.strip("[]"), int(port_text)
