"""Same-host transport: chunk bytes are read from the source's POSIX shared-memory segment.

A source keeps its tensors in a segment under ``/dev/shm``; the control messages (manifest, which
chunks are ready) still go over a loopback TCP channel, so partial relays and failover work as
with tcp. The receiver copies each chunk straight from the mapped segment into its own
preallocated tensors and checksums the copy in the same pass (``recovery.transfer.copy_digest``).

A fresh mapping pays a page fault per page on first touch, so both sides keep what they mapped:
a receiver keeps its mapping of a source's segment between pulls (at most
``MAX_CACHED_MAPPINGS`` idle ones; one whose segment was removed is dropped at the next pull or
``close()``), and a publisher recycles a retired version's segment for the next version of the
same layout (a reader still copying the retired version can only see a checksum mismatch, never
accept the new bytes as the old version's). Segments are named ``<prefix>-<pid>-...``;
:meth:`ShmTransport.sweep_stale` removes those whose owning process no longer exists.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from recovery.pids import process_exists
from recovery.transfer.copy_digest import NATIVE_CRC32C, CopyDigest, copy_digest_function
from recovery.transfer.errors import ProtocolError, TransferConfigError
from recovery.transfer.manifest import DTYPES, TensorSpec, byte_view
from recovery.transfer.store import Buffers
from recovery.transfer.tcp import TcpChannel, TcpListener, TcpTransport
from recovery.transfer.transport import ConnectionHandler, Transport

log = logging.getLogger("rlguard.recovery.transfer.shm")

_ALIGN = 64
#: Idle mappings of other processes' segments a transport keeps for the next pull.
MAX_CACHED_MAPPINGS = 4
#: Retired segments a publisher keeps for reuse by later versions. One covers a trainer that
#: retires a version per version it publishes; each kept segment holds a weight set's memory.
MAX_RECYCLED_SEGMENTS = 1


class _Mapping:
    """One read-only mapping of a segment, shared by the sessions that read it."""

    def __init__(self, path: Path, size: int) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            stat = os.fstat(fd)
            if stat.st_size < size:
                raise ProtocolError(
                    f"shared-memory segment {path} is smaller than announced ({size} bytes)"
                )
            self.map = mmap.mmap(fd, size, prot=mmap.PROT_READ) if size else None
        finally:
            os.close(fd)
        self.path = path
        self.identity = (stat.st_dev, stat.st_ino)
        self.size = size
        self.array = (
            np.frombuffer(self.map, dtype=np.uint8)
            if self.map is not None
            else np.empty(0, np.uint8)
        )
        self.users = 0

    def current(self) -> bool:
        """True while the segment this maps is still the file at its path."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return False
        return (stat.st_dev, stat.st_ino) == self.identity

    def close(self) -> None:
        # The numpy view exports the map's buffer: it must go before the map can close.
        self.array = np.empty(0, np.uint8)
        if self.map is not None:
            self.map.close()
            self.map = None


class SegmentReader:
    """Reads the chunks of one announced version out of a (possibly shared) segment mapping."""

    def __init__(
        self, mapping: _Mapping, offsets: Mapping[str, int], on_close: Callable[[_Mapping], None]
    ) -> None:
        self._mapping = mapping
        self._offsets = dict(offsets)
        self._on_close: Callable[[_Mapping], None] | None = on_close

    def _source(self, tensor: str, offset: int, length: int) -> np.ndarray:
        base = self._offsets.get(tensor)
        if base is None:
            raise ProtocolError(f"the segment has no tensor {tensor!r}")
        start = base + offset
        if (
            not isinstance(base, int)
            or base < 0
            or offset < 0
            or start + length > self._mapping.size
        ):
            raise ProtocolError(f"chunk of {tensor!r} at {offset} runs past the segment's end")
        return self._mapping.array[start : start + length]

    def read_into(self, dest: memoryview, tensor: str, offset: int) -> None:
        """memcpy ``len(dest)`` bytes of ``tensor`` at ``offset`` into ``dest``."""
        # numpy copies without holding the GIL, so copies run in parallel on verifier threads.
        np.copyto(np.frombuffer(dest, dtype=np.uint8), self._source(tensor, offset, len(dest)))

    def read_and_digest(
        self, dest: memoryview, tensor: str, offset: int, copy_digest: CopyDigest
    ) -> int:
        """Copy like :meth:`read_into` and return the checksum of what landed in ``dest``, in one
        pass over the bytes (``recovery.transfer.copy_digest``)."""
        return copy_digest(dest, self._source(tensor, offset, len(dest)))

    def close(self) -> None:
        """Done reading (idempotent); the transport decides whether the mapping stays."""
        if self._on_close is not None:
            self._on_close(self._mapping)
            self._on_close = None


class _Segment:
    """A segment this process created, with its tensors laid out back to back."""

    def __init__(self, path: Path, specs: Sequence[TensorSpec]) -> None:
        offsets: dict[str, int] = {}
        size = 0
        for spec in specs:
            offsets[spec.name] = size
            size += -(-spec.nbytes // _ALIGN) * _ALIGN
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, max(size, 1))
            segment = mmap.mmap(fd, max(size, 1))
        finally:
            os.close(fd)
        self.path = path
        self.specs = tuple(specs)
        self.tensors: dict[str, torch.Tensor] = {}
        for spec in specs:
            dtype = DTYPES[spec.dtype]
            count = spec.nbytes // dtype.itemsize
            if count == 0:
                self.tensors[spec.name] = torch.empty(spec.shape, dtype=dtype)
            else:
                flat = torch.frombuffer(
                    segment, dtype=dtype, count=count, offset=offsets[spec.name]
                )
                self.tensors[spec.name] = flat.view(spec.shape)
        self.extra: dict[str, Any] = {"shm_path": path.name, "offsets": offsets, "size": size}

    def unlink(self) -> None:
        # Unlinking frees the memory once every mapping (ours via the tensors, readers'
        # via theirs) is gone; the tensors keep our mapping alive as long as they live.
        try:
            self.path.unlink()
        except FileNotFoundError:
            log.info("segment already removed", extra={"path": str(self.path)})


def _unlink_all(segments: list[_Segment]) -> None:
    while segments:
        segments.pop().unlink()


class ShmTransport(Transport):
    """POSIX shared memory for data, loopback TCP for control; source and receiver share a host."""

    name: ClassVar[str] = "shm"
    inline_payload: ClassVar[bool] = False
    # The copies run on the verifier threads. The native copy+checksum loop moves a chunk at
    # memory speed on one thread: a second one sped a 1 GiB pull up by a third but cost 1.4-2.0x
    # the CPU of a memcpy per GiB instead of 1.2x (benchmarks/transfer.py --parts shm, 2 cores).
    # The two-step fallback is CPU-bound: two threads keep two cores busy.
    verify_threads: ClassVar[int] = 1 if NATIVE_CRC32C is not None else 2

    def __init__(
        self,
        *,
        shm_dir: str | Path = "/dev/shm",
        prefix: str = "rlg-xfer",
        sweep: bool = True,
        recycle_segments: int = MAX_RECYCLED_SEGMENTS,
    ) -> None:
        self.shm_dir = Path(shm_dir)
        if not self.shm_dir.is_dir():
            raise TransferConfigError(f"shm_dir {str(self.shm_dir)!r} is not a directory")
        if not prefix or "/" in prefix or prefix.startswith("."):
            raise TransferConfigError(f"prefix must be a plain file name, got {prefix!r}")
        if (
            not isinstance(recycle_segments, int)
            or isinstance(recycle_segments, bool)
            or recycle_segments < 0
        ):
            raise TransferConfigError(
                f"recycle_segments must be an int >= 0, got {recycle_segments!r}"
            )
        self.prefix = prefix
        self.recycle_segments = recycle_segments
        self._tcp = TcpTransport()
        self._lock = threading.Lock()
        self._mappings: OrderedDict[str, _Mapping] = OrderedDict()  # by segment name, oldest first
        self._recycled: list[_Segment] = []
        # Recycled segments belong to nobody else: unlink them when this transport goes away,
        # even if close() is never called (a killed process leaves them to sweep_stale).
        self._finalizer = weakref.finalize(self, _unlink_all, self._recycled)
        if sweep:
            self.sweep_stale()

    def listen(self, host: str, port: int, handler: ConnectionHandler) -> TcpListener:
        """Control channel listener (loopback TCP)."""
        return self._tcp.listen(host, port, handler)

    def connect(self, address: str, *, timeout: float) -> TcpChannel:
        """Control channel to a same-host source."""
        return self._tcp.connect(address, timeout=timeout)

    def _new_segment(self, specs: Sequence[TensorSpec], tag: str) -> _Segment:
        safe_tag = "".join(c if c.isalnum() else "_" for c in tag)
        return _Segment(
            self.shm_dir / f"{self.prefix}-{os.getpid()}-{safe_tag}_{uuid.uuid4().hex[:8]}", specs
        )

    def allocate(self, specs: Sequence[TensorSpec], *, tag: str) -> Buffers:
        """Tensors laid out back to back in a new shared-memory segment."""
        segment = self._new_segment(specs, tag)
        return Buffers(
            segment.tensors, segment.extra, lambda: self._release(segment, recycle=False)
        )

    def adopt(self, tensors: Mapping[str, torch.Tensor], *, tag: str) -> Buffers:
        """Copy a publisher's tensors into a segment (peers cannot read private memory).

        The segment is a retired version's one when its layout matches (its name then still
        carries the tag of the version it was made for), otherwise a new one.
        """
        segment = self._segment_for(tensors, tag)
        for name, tensor in tensors.items():
            # A plain single-threaded memcpy, not torch's copy_: torch splits a large copy over
            # its intra-op threads and waits for the slowest, and on a busy host (a trainer's,
            # or a shared one) a descheduled thread made a 10 MiB publish take 4 to 170 ms.
            if tensor.numel():
                dest = np.frombuffer(byte_view(segment.tensors[name]), dtype=np.uint8)
                np.copyto(dest, np.frombuffer(byte_view(tensor), dtype=np.uint8))
        return Buffers(segment.tensors, segment.extra, lambda: self._release(segment, recycle=True))

    def adopt_digested(
        self, tensors: Mapping[str, torch.Tensor], *, tag: str, chunk_bytes: int, checksum: str
    ) -> tuple[Buffers, list[int] | None]:
        """:meth:`adopt`, checksumming each chunk of the segment's copy as it is written (one
        pass over the bytes instead of a checksum pass and a copy pass): what the manifest
        vouches for is what peers read."""
        copy_digest = copy_digest_function(checksum)
        segment = self._segment_for(tensors, tag)
        digests: list[int] = []
        for name, tensor in tensors.items():
            if not tensor.numel():
                continue
            dest, source = byte_view(segment.tensors[name]), byte_view(tensor)
            for start in range(0, len(dest), chunk_bytes):
                stop = start + chunk_bytes
                digests.append(copy_digest(dest[start:stop], source[start:stop]))
        buffers = Buffers(
            segment.tensors, segment.extra, lambda: self._release(segment, recycle=True)
        )
        return buffers, digests

    def _segment_for(self, tensors: Mapping[str, torch.Tensor], tag: str) -> _Segment:
        """A retired segment of the same layout, or a new one."""
        specs = tuple(TensorSpec.of(n, t) for n, t in tensors.items())
        with self._lock:
            reuse = next((s for s in self._recycled if s.specs == specs), None)
            if reuse is not None:
                self._recycled.remove(reuse)
        return reuse if reuse is not None else self._new_segment(specs, tag)

    def _release(self, segment: _Segment, *, recycle: bool) -> None:
        with self._lock:
            keep = recycle and self._finalizer.alive and len(self._recycled) < self.recycle_segments
            if keep:
                self._recycled.append(segment)
        if not keep:
            segment.unlink()
            self._forget(segment.path.name)

    def open_payload(self, extra: Mapping[str, Any]) -> SegmentReader:
        """Map the segment a source announced (only names inside ``shm_dir`` with our prefix).

        A mapping made for an earlier pull is reused while it still maps that very file.
        """
        name, offsets, size = extra.get("shm_path"), extra.get("offsets"), extra.get("size")
        if (
            not isinstance(name, str)
            or "/" in name
            or not name.startswith(self.prefix + "-")
            or not isinstance(offsets, dict)
            or not all(isinstance(v, int) and v >= 0 for v in offsets.values())
            or not isinstance(size, int)
            or size < 0
        ):
            raise ProtocolError(f"bad shared-memory location from source: {dict(extra)!r:.200}")
        with self._lock:
            self._drop_idle(lambda m: not m.current())
            mapping = self._mappings.pop(name, None)
            if mapping is not None and (mapping.size < size or not mapping.current()):
                self._retire(mapping)
                mapping = None
            if mapping is None:
                try:
                    mapping = _Mapping(self.shm_dir / name, size)
                except FileNotFoundError as exc:
                    raise ProtocolError(
                        f"shared-memory segment {name} does not exist (source on another host?)"
                    ) from exc
            mapping.users += 1
            self._mappings[name] = mapping  # most recently used last
            return SegmentReader(mapping, offsets, self._done_reading)

    def _done_reading(self, mapping: _Mapping) -> None:
        with self._lock:
            mapping.users -= 1
            cached = self._mappings.get(mapping.path.name) is mapping
            if mapping.users == 0 and not (cached and self._finalizer.alive and mapping.current()):
                self._retire(mapping)
            idle = [m for m in self._mappings.values() if m.users == 0]
            for oldest in idle[: max(0, len(idle) - MAX_CACHED_MAPPINGS)]:
                self._retire(oldest)

    def _drop_idle(self, condition: Callable[[_Mapping], bool]) -> None:
        for mapping in [m for m in self._mappings.values() if m.users == 0 and condition(m)]:
            self._retire(mapping)

    def _retire(self, mapping: _Mapping) -> None:
        """Forget ``mapping`` and unmap it unless a reader still uses it (it is unmapped then)."""
        if self._mappings.get(mapping.path.name) is mapping:
            del self._mappings[mapping.path.name]
        if mapping.users == 0:
            mapping.close()

    def _forget(self, name: str) -> None:
        """Our own segment ``name`` was unlinked: a mapping we kept of it would pin its memory."""
        with self._lock:
            mapping = self._mappings.get(name)
            if mapping is not None and mapping.users == 0:
                self._retire(mapping)

    @property
    def cached_mappings(self) -> list[str]:
        """Names of the segments this transport keeps mapped (for tests and diagnostics)."""
        with self._lock:
            return list(self._mappings)

    @property
    def recycled_segments(self) -> list[str]:
        """Names of retired segments kept for reuse."""
        with self._lock:
            return [s.path.name for s in self._recycled]

    def close(self) -> None:
        """Unlink recycled segments and unmap idle mappings; readers still open unmap on close."""
        with self._lock:  # under the lock: a concurrent release then unlinks instead of keeping
            self._drop_idle(lambda m: True)
            self._finalizer()

    def sweep_stale(self) -> list[str]:
        """Unlink segments left by processes that no longer exist; returns their names."""
        removed: list[str] = []
        for path in self.shm_dir.glob(f"{self.prefix}-*"):
            pid_text = path.name[len(self.prefix) + 1 :].split("-", 1)[0]
            if not pid_text.isdigit() or process_exists(int(pid_text)):
                continue
            try:
                path.unlink()
                removed.append(path.name)
            except FileNotFoundError:
                continue  # another process swept it first
        return removed
