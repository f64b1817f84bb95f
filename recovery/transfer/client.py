"""The receiving side of one connection to one source: manifest, then a verified chunk stream."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from functools import partial
from typing import Any

from recovery._closing import ClosesOnExit
from recovery.transfer.copy_digest import copy_digest_function
from recovery.transfer.errors import (
    PeerDeadError,
    ProtocolError,
    UnknownVersionError,
    VersionDiscardedError,
)
from recovery.transfer.manifest import WeightManifest, checksum_function
from recovery.transfer.transport import PayloadReader, Transport
from recovery.transfer.wire import (
    CHUNK_HEADER,
    CHUNK_NOT_READY,
    CHUNK_OK,
    CHUNK_SOURCE_GAVE_UP,
    CHUNK_UNKNOWN,
    recv_message,
    send_message,
    unpack_chunk_header,
)

# Chunks under this size are copied and checksummed on the receiving thread (a norm's or a
# bias's tensor is one chunk of a few KiB; a thread hand-off and back costs tens of us).
INLINE_VERIFY_BYTES = 64 << 10


class SourceGaveUpError(VersionDiscardedError):
    """This one source dropped the version; the registry says whether it is gone everywhere."""


@dataclass
class StreamResult:
    """What one chunk stream delivered."""

    verified: int = 0
    corrupt: int = 0
    bytes: int = 0


class SourceSession(ClosesOnExit):
    """A connection to one source for one pull; every call is bounded by ``timeout``."""

    def __init__(self, transport: Transport, address: str, *, timeout: float) -> None:
        self.address = address
        self.timeout = timeout
        self._transport = transport
        self._channel = transport.connect(address, timeout=timeout)
        self._payload: PayloadReader | None = None

    def close(self) -> None:
        """Close the channel and any payload mapping."""
        if self._payload is not None:
            self._payload.close()
        self._channel.close()

    def manifest(self, name: str, version: int) -> WeightManifest:
        """Ask the source for its manifest of ``name`` v``version``."""
        send_message(
            self._channel,
            {"op": "manifest", "name": name, "version": version},
            timeout=self.timeout,
        )
        reply = recv_message(self._channel, timeout=self.timeout)
        if not reply.get("ok"):
            if reply.get("error") == "unknown_version":
                raise UnknownVersionError(f"{self.address} does not hold {name!r} v{version}")
            raise ProtocolError(f"{self.address} refused the manifest request: {reply!r:.200}")
        manifest = WeightManifest.from_json(reply["manifest"])
        if (manifest.name, manifest.version) != (name, version):
            raise ProtocolError(
                f"{self.address} answered {manifest.name!r} v{manifest.version} "
                f"for {name!r} v{version}"
            )
        if not self._transport.inline_payload:
            extra: dict[str, Any] = reply.get("extra") or {}
            self._payload = self._transport.open_payload(extra)
            if self._payload is None:
                raise ProtocolError(
                    f"{self.address} sent no payload location for {self._transport.name}"
                )
        return manifest

    def stats(self) -> dict[str, Any]:
        """The source's per-version serving counters."""
        send_message(self._channel, {"op": "stats"}, timeout=self.timeout)
        reply = recv_message(self._channel, timeout=self.timeout)
        stats = reply.get("stats")
        if not isinstance(stats, dict):
            raise ProtocolError(f"{self.address} sent malformed stats")
        return stats

    def stream(
        self,
        manifest: WeightManifest,
        ids: Sequence[int],
        dest: Sequence[memoryview],
        on_verified: Callable[[int], None],
        on_corrupt: Callable[[int, int], None],
        *,
        pool: Executor | None = None,
        window: int = 8,
    ) -> StreamResult:
        """Receive chunks ``ids`` into ``dest`` (in place), each verified against the manifest and
        reported through ``on_verified`` as soon as it landed (a relay serves it onwards while
        the rest arrives). With a ``pool``, checksums (and shm's copies) run on its threads up to
        ``window`` chunks ahead, results still in order. If the source fails mid-stream, the
        chunks that fully arrived are verified and reported before the error propagates."""
        result = StreamResult()
        if not ids:
            return result
        digest_of = checksum_function(manifest.checksum)
        # shm: chunks are copied out of the source's segment and checksummed in the same pass
        copy_digest = copy_digest_function(manifest.checksum) if self._payload is not None else None
        request = {
            "op": "chunks",
            "name": manifest.name,
            "version": manifest.version,
            "ids": list(ids),
        }
        send_message(self._channel, request, timeout=self.timeout)
        pending: deque[tuple[int, Future[int] | int]] = deque()

        def settle(keep: int) -> None:
            while len(pending) > keep or (pending and _done(pending[0][1])):
                index, outcome = pending.popleft()
                actual = outcome if isinstance(outcome, int) else outcome.result()
                if actual == manifest.chunks[index].checksum:
                    result.verified += 1
                    result.bytes += manifest.chunks[index].length
                    on_verified(index)
                else:
                    result.corrupt += 1
                    on_corrupt(index, actual)

        # One header buffer per chunk: on ucx the next headers' receives are posted while
        # earlier chunks land. Each header is checked before anything is received into its
        # chunk's memory; shm chunks have no body on the channel (the reader copies them).
        headers = [memoryview(bytearray(CHUNK_HEADER.size)) for _ in ids]
        payload = self._payload

        def body_for(i: int, header: memoryview) -> memoryview | None:
            self._check_header(manifest, ids[i], header)
            return dest[ids[i]] if payload is None else None

        try:
            for i in self._channel.recv_each(headers, body_for, timeout=self.timeout):
                expected = ids[i]
                view = dest[expected]
                if payload is None:
                    work: Callable[[], int] = partial(digest_of, view)
                else:
                    assert copy_digest is not None
                    chunk = manifest.chunks[expected]
                    work = partial(
                        payload.read_and_digest,
                        view,
                        manifest.tensors[chunk.tensor].name,
                        chunk.offset,
                        copy_digest,
                    )
                # A small chunk is verified here: handing it to a thread costs more than it.
                if pool is None or len(view) < INLINE_VERIFY_BYTES:
                    pending.append((expected, work()))
                else:
                    pending.append((expected, pool.submit(work)))
                settle(keep=window)
        finally:
            settle(keep=0)
        return result

    def _check_header(self, manifest: WeightManifest, expected: int, header: memoryview) -> None:
        """Raises unless ``header`` announces chunk ``expected`` with its manifest length."""
        index, status, length = unpack_chunk_header(header)
        if status == CHUNK_SOURCE_GAVE_UP:
            raise SourceGaveUpError(f"{self.address} dropped {manifest.name!r} v{manifest.version}")
        if status == CHUNK_NOT_READY:
            raise PeerDeadError(self.address, f"relay never got chunk {index}")
        if status == CHUNK_UNKNOWN:
            raise UnknownVersionError(
                f"{self.address} does not hold chunk {index} of v{manifest.version}"
            )
        chunk = manifest.chunks[expected]
        if status != CHUNK_OK or index != expected or length != chunk.length:
            raise ProtocolError(
                f"{self.address} sent chunk {index} status {status} length {length}, "
                f"expected chunk {expected} of {chunk.length} bytes"
            )


def _done(outcome: Future[int] | int) -> bool:
    return isinstance(outcome, int) or outcome.done()
