"""The rollout side: pull a version from whichever source holds it, then relay it.

A receiver keeps two preallocated slots: the live weights (version V−1) and a staging slot that
V is written into in place. V replaces V−1 only once it is complete, verified and committed, so
an aborted V leaves the live weights untouched. While V arrives, its verified chunks are already
served to other receivers (a pipelined relay); if the current source dies, the verified chunks
stay and only the missing ones are requested from the next source.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from recovery.transfer.client import SourceGaveUpError, SourceSession
from recovery.transfer.errors import (
    ChunkChecksumError,
    ManifestMismatchError,
    NoSourceError,
    PeerDeadError,
    ProtocolError,
    TransferConfigError,
    TransferError,
    TransferTimeout,
    UnknownVersionError,
    VersionDiscardedError,
)
from recovery.transfer.manifest import TensorSpec, WeightManifest, chunk_views
from recovery.transfer.registry import ABORTED, COMMITTED, SourceRegistry, VersionInfo
from recovery.transfer.server import WeightServer
from recovery.transfer.store import Buffers, ServedVersion, WeightStore
from recovery.transfer.transport import Transport

log = logging.getLogger("rlguard.recovery.transfer.receiver")


@dataclass
class PullReport:
    """How a pull went: where the chunks came from and what had to be fetched again."""

    name: str
    version: int
    seconds: float = 0.0
    #: Until the last chunk was verified (``seconds`` adds the wait for the publisher's commit).
    transfer_seconds: float = 0.0
    #: Of ``transfer_seconds``, receiving, copying and verifying chunks (the rest is the
    #: registry's calls and connecting to sources).
    stream_seconds: float = 0.0
    bytes: int = 0
    chunks_total: int = 0
    chunks_by_source: dict[str, int] = field(default_factory=dict)
    corrupt_chunks: int = 0
    dead_sources: list[str] = field(default_factory=list)


class _Pull:
    """State of one pull in progress (kept apart so the receiver's own state stays small)."""

    def __init__(self, name: str, version: int, deadline: float) -> None:
        self.report = PullReport(name, version)
        self.deadline = deadline
        self.manifest: WeightManifest | None = None
        self.served: ServedVersion | None = None
        self.views: list[memoryview] = []
        self.missing: set[int] = set()
        self.attempts: dict[int, int] = {}
        self.dead: set[str] = set()
        self.suspect: set[str] = set()
        #: The registry's record of the version, from the last ``open_pull``.
        self.info: VersionInfo | None = None
        #: The version the staging slot held, still to be withdrawn at the registry (by the
        #: first ``open_pull``), and whether that call's withdraw and announce are done.
        self.withdraw: int | None = None
        self.opened = False

    def left(self) -> float:
        return self.deadline - time.monotonic()


class WeightReceiver:
    """Receives versions of ``name`` into preallocated tensors laid out as ``specs``.

    ``timeout`` bounds every single blocking step (connect, one message, progress on one chunk):
    a source that makes no progress for that long is treated as dead. ``pull`` has its own overall
    timeout. With ``serve_as_relay`` the receiver serves what it holds at :attr:`address`.
    """

    def __init__(
        self,
        name: str,
        specs: Sequence[TensorSpec],
        *,
        transport: Transport,
        registry: SourceRegistry,
        host: str = "127.0.0.1",
        port: int = 0,
        serve_as_relay: bool = True,
        use_relays: bool = True,
        timeout: float = 10.0,
        max_chunk_attempts: int = 3,
        poll_interval: float = 0.05,
        egress_bytes_per_s: float | None = None,
        verify_threads: int | None = None,
    ) -> None:
        if verify_threads is None:
            verify_threads = transport.verify_threads
        if not isinstance(verify_threads, int) or verify_threads < 0:
            raise TransferConfigError(f"verify_threads must be an int >= 0, got {verify_threads!r}")
        if not timeout > 0 or not poll_interval > 0:
            raise TransferConfigError(
                f"timeout and poll_interval must be positive, got {timeout!r}, {poll_interval!r}"
            )
        if not isinstance(max_chunk_attempts, int) or max_chunk_attempts < 1:
            raise TransferConfigError(
                f"max_chunk_attempts must be an int >= 1, got {max_chunk_attempts!r}"
            )
        names = [s.name for s in specs]
        if not specs or len(set(names)) != len(names):
            raise TransferConfigError(f"specs must name each tensor once, got {names!r}")
        self.name = name
        self.specs = tuple(specs)
        self.transport = transport
        self.registry = registry
        self.use_relays = use_relays
        self.timeout = timeout
        self.max_chunk_attempts = max_chunk_attempts
        self.poll_interval = poll_interval
        self._slots: list[Buffers] = [
            transport.allocate(self.specs, tag=f"{name}-slot{i}") for i in (0, 1)
        ]
        self._slot_version: list[int | None] = [None, None]
        # Each slot's chunk views for the last chunk layout it received (layouts repeat from
        # version to version: the same tensors cut the same way), made once, not per pull.
        self._slot_views: list[tuple[Any, list[memoryview]] | None] = [None, None]
        self._live: int | None = None
        #: Progress of the pull in flight, readable from other threads (monitoring, tests).
        self.current_source: str | None = None
        self.verified_chunks = 0
        # Checksums (and shm copies) run here while the next chunk arrives; 0 = inline.
        self._pool = (
            ThreadPoolExecutor(verify_threads, thread_name_prefix="verify")
            if verify_threads
            else None
        )
        self.store = WeightStore()
        self.server: WeightServer | None = None
        if serve_as_relay:
            self.server = WeightServer(
                self.store, transport, host=host, port=port, egress_bytes_per_s=egress_bytes_per_s
            )
        # Without a server the receiver still needs a unique id for the registry's bookkeeping.
        self.address = self.server.address if self.server else f"receiver-{id(self):x}@{host}"

    @property
    def live_version(self) -> int | None:
        """The version the live tensors hold, or None before the first load."""
        return None if self._live is None else self._slot_version[self._live]

    @property
    def live_tensors(self) -> dict[str, torch.Tensor]:
        """The live weights (do not keep them across a pull: slots alternate)."""
        if self._live is None:
            raise TransferError(f"receiver of {self.name!r} holds no live version yet")
        return self._slots[self._live].tensors

    def load_initial(self, version: int, tensors: Mapping[str, torch.Tensor]) -> None:
        """Make ``tensors`` (e.g. from a checkpoint) the live version ``version``."""
        slot = 0
        for spec in self.specs:
            if spec.name not in tensors or TensorSpec.of(spec.name, tensors[spec.name]) != spec:
                raise ManifestMismatchError(
                    f"initial tensor {spec.name!r} is missing or does not match {spec}"
                )
        if set(tensors) - {s.name for s in self.specs}:
            raise ManifestMismatchError(
                f"unexpected initial tensors {sorted(set(tensors) - {s.name for s in self.specs})}"
            )
        for spec in self.specs:
            self._slots[slot].tensors[spec.name].copy_(tensors[spec.name])
        self._slot_version[slot] = version
        self._live = slot

    def pull(self, version: int, *, timeout: float = 300.0) -> PullReport:
        """Fetch ``version``, wait for its commit, and make it live; returns where it came from.

        Raises VersionDiscardedError (live weights unchanged) if the version was aborted,
        TransferTimeout if it could not be completed and committed within ``timeout``.
        """
        if not isinstance(version, int) or version < 0:
            raise TransferConfigError(f"version must be a non-negative int, got {version!r}")
        if not timeout > 0:
            raise TransferConfigError(f"timeout must be positive, got {timeout!r}")
        if self.live_version is not None and version <= self.live_version:
            raise TransferConfigError(
                f"version {version} is not newer than live v{self.live_version}"
            )
        start = time.monotonic()
        slot = 1 if self._live == 0 else 0
        pull = _Pull(self.name, version, start + timeout)
        pull.withdraw = self._vacate(slot)
        self.verified_chunks = 0
        # The registry's part costs two calls on the way that goes well: open_pull (withdraw
        # the slot's old version, announce this one, assign a source, the manifest's digest)
        # and close_pull (release the source, announce complete, wait for the commit).
        try:
            if self.server is not None:
                self.store.expect(self.name, version)
            while pull.manifest is None or pull.missing:
                self._one_source(pull, slot)
            pull.report.transfer_seconds = time.monotonic() - start
            self._wait_commit(pull)
        except BaseException:
            self._discard(slot, version, pull)
            raise
        self._slot_version[slot] = version
        self._live = slot
        pull.report.seconds = time.monotonic() - start
        return pull.report

    def _vacate(self, slot: int) -> int | None:
        """Stop serving the version ``slot`` holds; the version, for the registry to forget."""
        old = self._slot_version[slot]
        if old is not None:
            self.store.remove(self.name, old)
            self._slot_version[slot] = None
        return old

    def _discard(self, slot: int, version: int, pull: _Pull) -> None:
        self.store.remove(self.name, version)
        gone = [version] if pull.opened or pull.withdraw is None else [version, pull.withdraw]
        for old in gone:
            try:
                self.registry.withdraw(name=self.name, version=old, address=self.address)
            except (
                TransferError
            ) as exc:  # the pull already failed; the registry forgets us on abort
                log.warning(
                    "could not withdraw discarded version",
                    extra={"version": old, "error": str(exc)},
                )

    def _step_timeout(self, pull: _Pull) -> float:
        left = pull.left()
        if left <= 0:
            raise TransferTimeout(
                "sources", f"{self.name!r} v{pull.report.version} not complete in time"
            )
        return min(self.timeout, left)

    def _one_source(self, pull: _Pull, slot: int) -> None:
        """Pull what is missing from one assigned source; returns when it is done or failed."""
        version = pull.report.version
        step = self._step_timeout(pull)
        try:
            source, pull.info = self.registry.open_pull(
                name=self.name,
                version=version,
                receiver=self.address,
                exclude=pull.dead | pull.suspect,
                relays=self.use_relays,
                announce=self.server is not None and not pull.opened,
                withdraw=None if pull.opened else pull.withdraw,
            )
            pull.opened = True
        except NoSourceError:
            pull.opened = True  # the withdraw and the announce were done before the assignment
            self._check_not_aborted(pull)
            # Nothing else is left: give suspect sources (bounded by per-chunk attempts) and ones
            # that failed us (the registry re-lists a publisher that keeps renewing) another go.
            pull.suspect.clear()
            pull.dead.clear()
            time.sleep(min(self.poll_interval, step))
            return
        self.current_source = source
        try:
            with SourceSession(self.transport, source, timeout=step) as session:
                if pull.manifest is None:
                    self._start(pull, slot, session.manifest(self.name, version), source)
                else:
                    session.manifest(self.name, version)  # opens the payload mapping for shm
                self._stream(pull, session)
        except (PeerDeadError, UnknownVersionError) as exc:
            log.info("source lost", extra={"source": source, "error": str(exc)})
            pull.dead.add(source)
            pull.report.dead_sources.append(source)
            self.registry.report_dead(name=self.name, version=version, address=source)
        except SourceGaveUpError:
            self._check_not_aborted(pull)
            pull.dead.add(source)
        except ProtocolError as exc:
            # ManifestMismatchError is not caught: the publisher's (digest-checked) manifest does
            # not fit our buffers, and no other source can fix that.
            log.warning("source misbehaved", extra={"source": source, "error": str(exc)})
            pull.suspect.add(source)
        finally:
            self.current_source = None
            if pull.manifest is None or pull.missing:  # else close_pull releases it
                self.registry.release_source(name=self.name, version=version, receiver=self.address)

    def _start(self, pull: _Pull, slot: int, manifest: WeightManifest, source: str) -> None:
        assert pull.info is not None  # from the open_pull that assigned this source
        if manifest.digest() != pull.info.manifest_digest:
            raise ProtocolError(
                f"{source} sent a manifest whose digest differs from the publisher's"
            )
        buffers = self._slots[slot]
        layout = (manifest.tensors, tuple((c.tensor, c.offset, c.length) for c in manifest.chunks))
        cached = self._slot_views[slot]
        if cached is None or cached[0] != layout:
            manifest.check_fits(buffers.tensors)
            self._slot_views[slot] = cached = (layout, chunk_views(manifest, buffers.tensors))
        pull.manifest = manifest
        pull.views = cached[1]
        pull.missing = set(range(len(manifest.chunks)))
        pull.report.chunks_total = len(manifest.chunks)
        pull.report.bytes = manifest.total_bytes
        if self.server is not None:
            pull.served = ServedVersion(manifest, buffers, complete=False, views=pull.views)
            self.store.add(pull.served)

    def _stream(self, pull: _Pull, session: SourceSession) -> None:
        assert pull.manifest is not None
        source = session.address

        def verified(index: int) -> None:
            pull.missing.discard(index)
            self.verified_chunks += 1
            pull.report.chunks_by_source[source] = pull.report.chunks_by_source.get(source, 0) + 1
            if pull.served is not None:
                pull.served.mark_ready(index)

        def corrupt(index: int, actual: int) -> None:
            pull.report.corrupt_chunks += 1
            pull.suspect.add(source)
            pull.attempts[index] = pull.attempts.get(index, 0) + 1
            log.warning("corrupt chunk", extra={"chunk": index, "source": source})
            if pull.attempts[index] >= self.max_chunk_attempts:
                assert pull.manifest is not None
                raise ChunkChecksumError(
                    index, pull.manifest.chunks[index].checksum, actual, source
                )

        started = time.monotonic()
        try:
            session.stream(
                pull.manifest, sorted(pull.missing), pull.views, verified, corrupt, pool=self._pool
            )
        finally:
            pull.report.stream_seconds += time.monotonic() - started
        if pull.served is not None and not pull.missing:
            pull.served.mark_complete()

    def _check_not_aborted(self, pull: _Pull) -> None:
        info = self.registry.info(name=self.name, version=pull.report.version)
        if info.state == ABORTED:
            raise VersionDiscardedError(f"{self.name!r} v{info.version} was aborted: {info.reason}")

    def _wait_commit(self, pull: _Pull) -> None:
        # Blocks on the registry (no polling): the version is committed as soon as this
        # receiver is complete (by the registry itself under protocol 2, else by the publisher
        # when it sees it), and the registry wakes this wait then.
        info = self.registry.close_pull(
            name=self.name,
            version=pull.report.version,
            receiver=self.address,
            timeout=self._step_timeout(pull),
        )
        while True:
            if info.state == COMMITTED:
                return
            if info.state == ABORTED:
                raise VersionDiscardedError(
                    f"{self.name!r} v{info.version} was aborted: {info.reason}"
                )
            info = self.registry.wait(
                name=self.name,
                version=pull.report.version,
                min_complete=None,
                timeout=self._step_timeout(pull),
            )

    def close(self) -> None:
        """Stop serving and release both slots."""
        if self.server is not None:
            self.server.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        for buffers in self._slots:
            buffers.release()
