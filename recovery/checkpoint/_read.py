"""Reading a committed checkpoint's files back in one pass, checksums verified as the bytes arrive.

Each file is read exactly once, into a preallocated uint8 tensor, in 8 MiB chunks, each chunk
checksummed as soon as it has landed, so verification is not a second pass:

* large files (>= 32 MiB) with ``O_DIRECT``, as the engine writes them: four reader threads keep
  four chunk requests in flight (the device's queue depth, not a claim on the cores) and the
  calling thread checksums the chunks in file order;
* everything else, and filesystems without ``O_DIRECT``, through the page cache in one thread,
  with ``POSIX_FADV_WILLNEED`` so the kernel reads ahead while the thread copies and checksums.

Files larger than one chunk are read concurrently, one thread each. A file is refused
(:class:`CheckpointCorrupt`) when it is missing, its size differs from the marker's, it shrinks
or is replaced while being read, or its checksum differs; the caller gets its bytes only after
the whole file verified. The returned :class:`ReadFile` carries the ``(inode, size, mtime_ns)``
of the open descriptor, i.e. of exactly the bytes that were checked.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from recovery.checkpoint import atomic
from recovery.checkpoint.errors import CheckpointCorrupt

CHUNK = 8 << 20
# Files at least this large are read with O_DIRECT by DIRECT_READERS threads (each waits on the
# device, not the CPU, so more than the core count is fine: it is the device's queue depth).
DIRECT_MIN = 4 * CHUNK
DIRECT_READERS = 4


@dataclass(frozen=True)
class ReadFile:
    """One listed file's bytes, read and (unless asked not to) checksum-verified."""

    name: str
    data: torch.Tensor
    stat: tuple[int, int, int]
    verified: bool


def expected_entry(directory: Path, name: str, files: Mapping[str, Any]) -> Mapping[str, Any]:
    """The marker's entry for ``name``; CheckpointCorrupt when the marker does not list it."""
    entry = files.get(name)
    if not isinstance(entry, Mapping) or not isinstance(entry.get("size"), int):
        raise CheckpointCorrupt(f"{directory.name}: marker does not list {name}")
    return entry


def check_sizes(directory: Path, files: Mapping[str, Any], names: Sequence[str]) -> None:
    """Every file in ``names`` exists with the marker's size. Reads no data: this is what refuses
    a torn checkpoint (a file missing or cut short) without touching its bytes."""
    for name in names:
        entry = expected_entry(directory, name, files)
        try:
            size = (directory / name).stat().st_size
        except FileNotFoundError:
            raise CheckpointCorrupt(f"{directory.name}: file {name} is missing") from None
        except OSError as exc:
            raise CheckpointCorrupt(f"{directory.name}: file {name} unreadable: {exc}") from None
        if size != entry["size"]:
            raise CheckpointCorrupt(
                f"{directory.name}: file {name} is {size} bytes, marker says {entry['size']}"
            )


def _fill(fd: int, view: memoryview, offset: int, what: str) -> None:
    """Read ``len(view)`` bytes at ``offset`` into ``view``; CheckpointCorrupt on early EOF."""
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            raise CheckpointCorrupt(f"{what} shrank while reading")
        got += n


def read_file(
    directory: Path,
    name: str,
    files: Mapping[str, Any],
    *,
    verify: bool,
    chunk: int = CHUNK,
    direct_min: int = DIRECT_MIN,
) -> ReadFile:
    """Read the listed file ``name`` in one pass, checking size and (with ``verify``) checksum."""
    entry = expected_entry(directory, name, files)
    what = f"{directory.name}: file {name}"
    algorithm, expected_hex = atomic.expected_checksum(entry)
    try:
        fd = os.open(directory / name, os.O_RDONLY)
    except FileNotFoundError:
        raise CheckpointCorrupt(f"{what} is missing") from None
    except OSError as exc:  # e.g. removed by retention since the marker was read
        raise CheckpointCorrupt(f"{what} unreadable: {exc}") from None
    try:
        st = os.fstat(fd)
        size = st.st_size
        if size != entry["size"]:
            raise CheckpointCorrupt(f"{what} is {size} bytes, marker says {entry['size']}")
        digest = atomic.new_hasher(algorithm) if verify else None
        data = None
        if size >= direct_min:
            data = _read_direct(directory / name, st, digest, chunk, what)
        if data is None:  # O_DIRECT did not apply: start over (a fresh digest) through the cache
            digest = atomic.new_hasher(algorithm) if verify else None
            data = _read_buffered(fd, size, digest, chunk, what)
        if digest is not None and digest.hexdigest() != expected_hex:
            raise CheckpointCorrupt(f"{directory.name}: checksum mismatch in {name}")
    except OSError as exc:
        raise CheckpointCorrupt(f"{what} unreadable: {exc}") from None
    finally:
        os.close(fd)
    return ReadFile(name, data, (st.st_ino, st.st_size, st.st_mtime_ns), verify)


def _read_buffered(fd: int, size: int, digest: Any, chunk: int, what: str) -> torch.Tensor:
    """Through the page cache, one thread: each chunk is checksummed as soon as it lands."""
    if size > chunk:
        # The kernel starts reading the whole file now, so the storage works ahead of our copies.
        os.posix_fadvise(fd, 0, size, os.POSIX_FADV_WILLNEED)
    data = torch.empty(size, dtype=torch.uint8)
    view = memoryview(data.numpy().data).cast("B") if size else memoryview(b"")
    for start in range(0, size, chunk):
        part = view[start : start + chunk]
        _fill(fd, part, start, what)
        if digest is not None:
            digest.update(part)
    return data


def _read_direct(
    path: Path, st: os.stat_result, digest: Any, chunk: int, what: str
) -> torch.Tensor | None:
    """With O_DIRECT, DIRECT_READERS chunks in flight: the device writes straight into our
    buffer (no page-cache copy, so almost no CPU per byte) while this thread checksums each chunk
    in file order as it lands. None (nothing read) where O_DIRECT does not apply (a filesystem
    without it, such as tmpfs, or a device wanting a larger alignment): the caller then reads
    buffered."""
    o_direct = getattr(os, "O_DIRECT", 0)
    if not o_direct:
        return None
    try:
        dfd = os.open(path, os.O_RDONLY | o_direct)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return None
        raise
    try:
        if os.fstat(dfd).st_ino != st.st_ino:
            raise CheckpointCorrupt(f"{what} was replaced while being opened")
        size = st.st_size
        raw = torch.empty(size + atomic.DIRECT_ALIGN, dtype=torch.uint8)
        offset = (-raw.data_ptr()) % atomic.DIRECT_ALIGN
        data = raw[offset : offset + size]
        view = memoryview(data.numpy().data).cast("B")
        bulk = size - size % atomic.DIRECT_ALIGN
        starts = list(range(0, bulk, chunk))
        if not _direct_chunks(dfd, view, starts, chunk, bulk, digest, what):
            return None
    finally:
        os.close(dfd)
    if bulk < size:  # the tail that is not a whole block: through the page cache
        tail = view[bulk:]
        with open(path, "rb", buffering=0) as fh:
            if os.fstat(fh.fileno()).st_ino != st.st_ino:
                raise CheckpointCorrupt(f"{what} was replaced while being read")
            _fill(fh.fileno(), tail, bulk, what)
        if digest is not None:
            digest.update(tail)
    return data


def _direct_chunks(
    fd: int,
    view: memoryview,
    starts: list[int],
    chunk: int,
    bulk: int,
    digest: Any,
    what: str,
) -> bool:
    """Reader threads take the chunks in file order; this thread checksums them in order.
    False when the device refuses the O_DIRECT reads (EINVAL) before any chunk was read."""
    landed = [threading.Event() for _ in starts]
    errors: list[BaseException] = []
    pending = iter(range(len(starts)))
    take = threading.Lock()
    failed = threading.Event()

    def reader() -> None:
        while not failed.is_set():
            with take:
                i = next(pending, None)
            if i is None:
                return
            try:
                end = min(starts[i] + chunk, bulk)
                _fill(fd, view[starts[i] : end], starts[i], what)
            except BaseException as exc:  # raised by the checksumming thread below
                errors.append(exc)
                failed.set()
            finally:
                landed[i].set()

    threads = [
        threading.Thread(target=reader, name="rlguard-ckpt-read", daemon=True)
        for _ in range(min(DIRECT_READERS, len(starts)))
    ]
    for t in threads:
        t.start()
    try:
        for i, start in enumerate(starts):
            # Chunks are taken in order, so every chunk before a failed one is still landing.
            landed[i].wait()
            if failed.is_set():
                break
            if digest is not None:
                digest.update(view[start : min(start + chunk, bulk)])
    finally:
        failed.set()
        for t in threads:
            t.join()
    if errors:
        first = errors[0]
        if isinstance(first, OSError) and first.errno == errno.EINVAL:
            return False
        raise first
    return True


def read_files(
    directory: Path, names: Sequence[str], files: Mapping[str, Any], *, verify: Mapping[str, bool]
) -> dict[str, ReadFile]:
    """Read several listed files of ``directory``, the large ones concurrently; the first
    failure is raised (after every read has stopped), so nothing partial is ever returned."""
    large = [n for n in names if _listed_size(files, n) > CHUNK]
    if len(large) <= 1:
        return {n: read_file(directory, n, files, verify=verify[n]) for n in names}
    with ThreadPoolExecutor(max_workers=len(large), thread_name_prefix="rlguard-ckpt-read") as pool:
        futures = {n: pool.submit(read_file, directory, n, files, verify=verify[n]) for n in large}
        out = {
            n: read_file(directory, n, files, verify=verify[n]) for n in names if n not in futures
        }
    out.update({n: f.result() for n, f in futures.items()})
    return {n: out[n] for n in names}


def _listed_size(files: Mapping[str, Any], name: str) -> int:
    entry = files.get(name)
    size = entry.get("size") if isinstance(entry, Mapping) else None
    return size if isinstance(size, int) else 0
