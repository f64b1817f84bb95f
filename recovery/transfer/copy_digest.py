"""Copy a chunk and checksum what was copied, in one pass over the bytes.

A same-host (shm) receiver copies every chunk out of the source's shared-memory segment into
its own buffers and verifies the copy against the manifest. The checksum is always of the
receiver's copy, never a second read of the source, whose owner may overwrite it at any moment
(a recycled segment): what is verified is what stays.

Two ways, the same result:

- the native loop (``_copycrc``, built from ``_copycrc.c`` on x86-64 with SSE4.2, CRC-32C only):
  each 16-byte load is checksummed and stored straight to memory, faster than a plain memcpy
  of the same bytes (``benchmarks/transfer.py --parts shm``);
- elsewhere (other checksums, other CPUs, a build without a C compiler): copy a cache-sized
  block, then checksum it while it is still in cache.
"""

from __future__ import annotations

import logging
from typing import Protocol

import numpy as np

from recovery.transfer.manifest import Checksum, checksum_function

log = logging.getLogger("rlguard.recovery.transfer.copy_digest")

# Copy-then-checksum granularity of the fallback: half of a core's L2 (1 MiB on the EPYC this
# was tuned on), so the checksum reads what the copy just wrote from cache instead of from
# memory. Measured CPU time per GiB (copy + crc32c): 4 MiB blocks 164-177 ms, 1 MiB 145-148 ms,
# 512 KiB 120-126 ms, 128-384 KiB 124-135 ms (more calls); a plain memcpy of the same GiB 92 ms.
COPY_BLOCK_BYTES = 512 << 10


class CopyDigest(Protocol):
    """``copy_digest(dest, source)``: copy ``source`` into ``dest`` (the same length) and return
    the checksum of the bytes now in ``dest``."""

    def __call__(self, dest: memoryview, source: memoryview | np.ndarray, /) -> int: ...


def _native_crc32c() -> CopyDigest | None:
    try:
        from recovery.transfer._copycrc import copy_crc32c
    except ImportError as exc:
        log.info("no native copy+crc32c, copying and checksumming in two steps: %s", exc)
        return None
    return copy_crc32c


NATIVE_CRC32C = _native_crc32c()


def blockwise(digest_of: Checksum) -> CopyDigest:
    """Copy block by block, checksumming each block right after it landed (from cache)."""

    def copy_digest(dest: memoryview, source: memoryview | np.ndarray) -> int:
        target = np.frombuffer(dest, dtype=np.uint8)
        origin = np.frombuffer(source, dtype=np.uint8)
        if len(origin) != len(target):
            raise ValueError(f"dest has {len(target)} bytes, source {len(origin)}")
        value = 0
        for start in range(0, len(target), COPY_BLOCK_BYTES):
            stop = start + COPY_BLOCK_BYTES
            np.copyto(target[start:stop], origin[start:stop])  # numpy copies without the GIL
            value = digest_of(dest[start:stop], value)
        return value

    return copy_digest


def copy_digest_function(checksum: str) -> CopyDigest:
    """The one-pass copy and checksum for the manifest checksum called ``checksum``."""
    if checksum == "crc32c" and NATIVE_CRC32C is not None:
        return NATIVE_CRC32C
    return blockwise(checksum_function(checksum))
