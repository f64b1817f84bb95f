"""The trainer side: publish a version, keep its lease alive, commit once a replica holds it.

A version counts as published (committed) only when at least ``min_replicas`` receivers hold a
complete, verified copy. Until then the publisher renews a short lease; if it dies, the lease
lapses, the registry aborts the version and every receiver discards its partial copy.

After the commit the publisher goes on renewing, less often, for as long as it serves the
version: a renewal is its proof of life, which lifts a receiver's report that it is dead. A
receiver that waited one step too long on a live but loaded publisher reports it dead; without
renewals after the commit nothing would ever lift that report, and once the relays are gone the
version could not be fetched from anywhere although its publisher still serves it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from recovery.transfer.errors import (
    TransferConfigError,
    TransferError,
    TransferTimeout,
    UnknownVersionError,
    VersionDiscardedError,
)
from recovery.transfer.manifest import (
    DEFAULT_CHECKSUM,
    DEFAULT_CHUNK_BYTES,
    MAX_CHUNK_BYTES,
    NonContiguousPolicy,
    build_manifest,
    prepare_tensors,
)
from recovery.transfer.registry import COMMITTED, SourceRegistry
from recovery.transfer.server import WeightServer
from recovery.transfer.store import ServedVersion, WeightStore
from recovery.transfer.transport import Transport

log = logging.getLogger("rlguard.recovery.transfer.publisher")


@dataclass
class Publication:
    """One version being published; :meth:`wait_committed` blocks until it is usable."""

    name: str
    version: int
    manifest_digest: str
    _done: threading.Event = field(default_factory=threading.Event)
    state: str = "publishing"
    error: str = ""

    def wait_committed(self, *, timeout: float) -> None:
        """Block until committed; raises VersionDiscardedError or TransferTimeout."""
        if not self._done.wait(timeout):
            raise TransferTimeout(
                "registry", f"{self.name!r} v{self.version} not committed in {timeout}s"
            )
        if self.state != COMMITTED:
            raise VersionDiscardedError(f"{self.name!r} v{self.version} was aborted: {self.error}")


class WeightPublisher:
    """Serves the trainer's weight sets and drives their publish → commit protocol."""

    def __init__(
        self,
        name: str,
        *,
        transport: Transport,
        registry: SourceRegistry,
        host: str = "127.0.0.1",
        port: int = 0,
        lease_s: float = 10.0,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        noncontiguous: NonContiguousPolicy = "copy",
        egress_bytes_per_s: float | None = None,
        poll_interval: float = 0.05,
    ) -> None:
        if not lease_s > 0 or not poll_interval > 0:
            raise TransferConfigError(
                f"lease_s and poll_interval must be positive, got {lease_s!r}, {poll_interval!r}"
            )
        if not isinstance(chunk_bytes, int) or not 0 < chunk_bytes <= MAX_CHUNK_BYTES:
            raise TransferConfigError(
                f"chunk_bytes must be in 1..{MAX_CHUNK_BYTES}, got {chunk_bytes!r}"
            )
        self.name = name
        self.transport = transport
        self.registry = registry
        self.lease_s = lease_s
        self.chunk_bytes = chunk_bytes
        self.noncontiguous: NonContiguousPolicy = noncontiguous
        self.poll_interval = poll_interval
        self.store = WeightStore()
        self.server = WeightServer(
            self.store, transport, host=host, port=port, egress_bytes_per_s=egress_bytes_per_s
        )
        self.address = self.server.address
        self._closed = threading.Event()

    def publish(
        self, version: int, tensors: Mapping[str, torch.Tensor], *, min_replicas: int = 1
    ) -> Publication:
        """Start serving ``tensors`` as ``version``; the caller must not modify CPU tensors until
        retired (they are served from where they are). CUDA tensors are copied to pinned host
        memory here, so the trainer may update its GPU weights as soon as this returns.

        Non-contiguous tensors are copied or refused according to ``noncontiguous``.
        """
        if not isinstance(min_replicas, int) or min_replicas < 1:
            raise TransferConfigError(f"min_replicas must be an int >= 1, got {min_replicas!r}")
        ready = prepare_tensors(tensors, noncontiguous=self.noncontiguous)
        # The served copy's checksums, taken while it is made where the transport copies (shm).
        buffers, digests = self.transport.adopt_digested(
            ready,
            tag=f"{self.name}-v{version}",
            chunk_bytes=self.chunk_bytes,
            checksum=DEFAULT_CHECKSUM,
        )
        try:
            manifest = build_manifest(
                self.name, version, buffers.tensors, chunk_bytes=self.chunk_bytes, digests=digests
            )
        except BaseException:
            buffers.release()
            raise
        served = ServedVersion(manifest, buffers, complete=True)
        digest = manifest.digest()
        # The registry commits once min_replicas receivers are complete (the publisher too, at
        # its next wake-up: both are the same rule), so a receiver does not wait on this process.
        self.registry.begin(
            name=self.name,
            version=version,
            manifest_digest=digest,
            publisher=self.address,
            lease_s=self.lease_s,
            commit_at=min_replicas + 1,
        )
        self.store.add(served)
        publication = Publication(self.name, version, digest)
        threading.Thread(
            target=self._drive,
            args=(publication, served, min_replicas),
            name=f"publish-{self.name}-v{version}",
            daemon=True,
        ).start()
        return publication

    def _drive(self, publication: Publication, served: ServedVersion, min_replicas: int) -> None:
        # Renew often enough that two missed renewals still leave the lease alive (and look at
        # the close flag every poll_interval); between renewals, block on the registry until
        # enough replicas are complete, so the commit follows the last replica at once.
        period = min(self.lease_s / 3, self.poll_interval)
        try:
            while not self._closed.is_set():
                self.registry.wait(
                    name=self.name,
                    version=publication.version,
                    min_complete=min_replicas + 1,
                    timeout=period,
                )
                if self._closed.is_set():
                    continue  # the loop's else: closed before the commit
                info = self.registry.renew(
                    name=self.name, version=publication.version, lease_s=self.lease_s
                )
                if info.state == COMMITTED or info.complete_sources - 1 >= min_replicas:
                    self.registry.commit(name=self.name, version=publication.version)
                    publication.state = COMMITTED
                    log.info(
                        "committed", extra={"weight_set": self.name, "version": publication.version}
                    )
                    break
            else:
                publication.state, publication.error = "aborted", "publisher closed before commit"
                return
        except TransferError as exc:
            publication.state, publication.error = "aborted", str(exc)
            log.warning("publication aborted", extra={"weight_set": self.name, "error": str(exc)})
            # The registry may be the thing that failed: only local resources are released here.
            served_now = self.store.remove(self.name, publication.version)
            if served_now is not None:
                served_now.buffers.release()
            return
        finally:
            publication._done.set()
        self._keep_alive(publication.version, served)

    def _keep_alive(self, version: int, served: ServedVersion) -> None:
        """Renew the committed ``version`` while this publisher serves it (see the module doc)."""
        while (
            not self._closed.wait(self.lease_s / 3) and self.store.get(self.name, version) is served
        ):
            try:
                self.registry.renew(name=self.name, version=version, lease_s=self.lease_s)
            except UnknownVersionError:
                return  # the registry dropped the version (it keeps only the newest few)
            except TransferError as exc:  # the registry is unreachable: it is asked again next time
                log.warning(
                    "renewal of a committed version failed",
                    extra={"version": version, "error": str(exc)},
                )

    def retire(self, version: int) -> None:
        """Stop serving ``version`` and free its buffers."""
        served = self.store.remove(self.name, version)
        if served is not None:
            self.registry.withdraw(name=self.name, version=version, address=self.address)
            served.buffers.release()

    def close(self) -> None:
        """Stop serving everything."""
        self._closed.set()
        self.server.close()
