"""Same-host transport: chunk bytes are read from the source's POSIX shared-memory segment.

A source keeps its tensors in a segment under ``/dev/shm``; the control messages (manifest, which
chunks are ready) still go over a loopback TCP channel, so partial relays and failover work as
with tcp. The receiver copies each chunk straight from the mapped segment into its own
preallocated tensors (one memcpy) and verifies it there.

Segments are named ``<prefix>-<pid>-...``; a source killed with SIGKILL cannot unlink its own, so
:meth:`ShmTransport.sweep_stale` removes segments whose owning process no longer exists.
"""

from __future__ import annotations

import logging
import mmap
import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from recovery.transfer.errors import ProtocolError, TransferConfigError
from recovery.transfer.manifest import DTYPES, TensorSpec
from recovery.transfer.store import Buffers
from recovery.transfer.tcp import TcpChannel, TcpListener, TcpTransport
from recovery.transfer.transport import ConnectionHandler, Transport

log = logging.getLogger("rlguard.recovery.transfer.shm")

_ALIGN = 64


class _SegmentReader:
    """A read-only mapping of a source's segment."""

    def __init__(self, path: Path, offsets: Mapping[str, int], size: int) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            if os.fstat(fd).st_size < size:
                raise ProtocolError(f"shared-memory segment {path} is smaller than announced ({size} bytes)")
            self._map = mmap.mmap(fd, size, prot=mmap.PROT_READ) if size else None
        finally:
            os.close(fd)
        self._view = memoryview(self._map) if self._map is not None else memoryview(b"")
        self._offsets = dict(offsets)

    def read_into(self, dest: memoryview, tensor: str, offset: int) -> None:
        """memcpy ``len(dest)`` bytes of ``tensor`` at ``offset`` into ``dest``."""
        base = self._offsets.get(tensor)
        if base is None:
            raise ProtocolError(f"the segment has no tensor {tensor!r}")
        start = base + offset
        if start + len(dest) > len(self._view):
            raise ProtocolError(f"chunk of {tensor!r} at {offset} runs past the segment's end")
        # numpy copies without holding the GIL, so copies run in parallel on verifier threads.
        np.copyto(np.frombuffer(dest, dtype=np.uint8), np.frombuffer(self._view[start : start + len(dest)], dtype=np.uint8))

    def close(self) -> None:
        """Unmap the segment."""
        self._view.release()
        if self._map is not None:
            self._map.close()


class ShmTransport(Transport):
    """POSIX shared memory for data, loopback TCP for control; source and receiver share a host."""

    name: ClassVar[str] = "shm"
    inline_payload: ClassVar[bool] = False

    def __init__(self, *, shm_dir: str | Path = "/dev/shm", prefix: str = "rlg-xfer", sweep: bool = True) -> None:
        self.shm_dir = Path(shm_dir)
        if not self.shm_dir.is_dir():
            raise TransferConfigError(f"shm_dir {str(self.shm_dir)!r} is not a directory")
        if not prefix or "/" in prefix or prefix.startswith("."):
            raise TransferConfigError(f"prefix must be a plain file name, got {prefix!r}")
        self.prefix = prefix
        self._tcp = TcpTransport()
        if sweep:
            self.sweep_stale()

    def listen(self, host: str, port: int, handler: ConnectionHandler) -> TcpListener:
        """Control channel listener (loopback TCP)."""
        return self._tcp.listen(host, port, handler)

    def connect(self, address: str, *, timeout: float) -> TcpChannel:
        """Control channel to a same-host source."""
        return self._tcp.connect(address, timeout=timeout)

    def allocate(self, specs: Sequence[TensorSpec], *, tag: str) -> Buffers:
        """Tensors laid out back to back in a new shared-memory segment."""
        offsets: dict[str, int] = {}
        size = 0
        for spec in specs:
            offsets[spec.name] = size
            size += -(-spec.nbytes // _ALIGN) * _ALIGN
        safe_tag = "".join(c if c.isalnum() else "_" for c in tag)
        path = self.shm_dir / f"{self.prefix}-{os.getpid()}-{safe_tag}_{uuid.uuid4().hex[:8]}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, max(size, 1))
            segment = mmap.mmap(fd, max(size, 1))
        finally:
            os.close(fd)
        tensors: dict[str, torch.Tensor] = {}
        for spec in specs:
            dtype = DTYPES[spec.dtype]
            count = spec.nbytes // dtype.itemsize
            if count == 0:
                tensors[spec.name] = torch.empty(spec.shape, dtype=dtype)
            else:
                flat = torch.frombuffer(segment, dtype=dtype, count=count, offset=offsets[spec.name])
                tensors[spec.name] = flat.view(spec.shape)

        def release() -> None:
            # Unlinking frees the memory once every mapping (ours via the tensors, readers'
            # via theirs) is gone; the tensors keep our mapping alive as long as they live.
            try:
                path.unlink()
            except FileNotFoundError:
                log.info("segment already removed", extra={"path": str(path)})

        extra: dict[str, Any] = {"shm_path": path.name, "offsets": offsets, "size": size}
        return Buffers(tensors, extra, release)

    def adopt(self, tensors: Mapping[str, torch.Tensor], *, tag: str) -> Buffers:
        """Copy a publisher's tensors into a segment (peers cannot read private memory)."""
        buffers = self.allocate([TensorSpec.of(n, t) for n, t in tensors.items()], tag=tag)
        for name, tensor in tensors.items():
            buffers.tensors[name].copy_(tensor)
        return buffers

    def open_payload(self, extra: Mapping[str, Any]) -> _SegmentReader:
        """Map the segment a source announced (only names inside ``shm_dir`` with our prefix)."""
        name, offsets, size = extra.get("shm_path"), extra.get("offsets"), extra.get("size")
        if (
            not isinstance(name, str)
            or "/" in name
            or not name.startswith(self.prefix + "-")
            or not isinstance(offsets, dict)
            or not isinstance(size, int)
        ):
            raise ProtocolError(f"bad shared-memory location from source: {dict(extra)!r:.200}")
        try:
            return _SegmentReader(self.shm_dir / name, offsets, size)
        except FileNotFoundError as exc:
            raise ProtocolError(f"shared-memory segment {name} does not exist (source on another host?)") from exc

    def sweep_stale(self) -> list[str]:
        """Unlink segments left by processes that no longer exist; returns their names."""
        removed: list[str] = []
        for path in self.shm_dir.glob(f"{self.prefix}-*"):
            pid_text = path.name[len(self.prefix) + 1 :].split("-", 1)[0]
            if not pid_text.isdigit() or _alive(int(pid_text)):
                continue
            try:
                path.unlink()
                removed.append(path.name)
            except FileNotFoundError:
                continue  # another process swept it first
        return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
