"""One-pass copy and checksum (``recovery.transfer.copy_digest``): the native CRC-32C loop and the
blockwise fallback copy exactly the bytes asked for and return the checksum the manifest uses."""

from __future__ import annotations

import platform
import zlib

import crc32c
import numpy as np
import pytest

from recovery.transfer import copy_digest as cd
from recovery.transfer.manifest import CHECKSUMS

# Around every boundary of the native loop: the 16-byte alignment head, the 3 x 256-byte rounds,
# the 8-byte words and the last bytes; and across the fallback's 512 KiB blocks.
LENGTHS = [0, 1, 7, 8, 15, 16, 17, 255, 256, 767, 768, 769, 775, 1536, 4099, 100_003]
LENGTHS += [cd.COPY_BLOCK_BYTES - 1, cd.COPY_BLOCK_BYTES * 2 + 13]


def _ways() -> list[tuple[str, cd.CopyDigest, str]]:
    ways = [(f"blockwise-{name}", cd.blockwise(fn), name) for name, fn in CHECKSUMS.items()]
    if cd.NATIVE_CRC32C is not None:
        ways.append(("native-crc32c", cd.NATIVE_CRC32C, "crc32c"))
    return ways


REFERENCE = {"crc32c": crc32c.crc32c, "crc32": zlib.crc32}


@pytest.mark.parametrize(
    ("way", "copy_digest", "checksum"), _ways(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_copies_exactly_and_returns_the_checksum_of_the_copy(
    way: str, copy_digest: cd.CopyDigest, checksum: str
) -> None:
    rng = np.random.default_rng(7)
    for length in LENGTHS:
        for misalign in (0, 1, 9):  # destinations not on a 16-byte boundary
            source = rng.integers(0, 256, length, dtype=np.uint8)
            guard = misalign + length + 5
            dest = np.full(guard, 0xA5, dtype=np.uint8)
            got = copy_digest(memoryview(dest)[misalign : misalign + length], source)
            assert got == REFERENCE[checksum](source.tobytes()), (way, length, misalign)
            assert np.array_equal(dest[misalign : misalign + length], source)
            assert (dest[:misalign] == 0xA5).all() and (dest[misalign + length :] == 0xA5).all()


def test_the_native_loop_continues_a_checksum_like_the_library() -> None:
    if cd.NATIVE_CRC32C is None:
        pytest.skip("no native loop on this machine (see test_the_native_loop_is_built_on_x86_64)")
    data = np.arange(5000, dtype=np.uint32).view(np.uint8)
    first = cd.NATIVE_CRC32C(memoryview(np.empty(1000, np.uint8)), data[:1000])
    rest = cd.NATIVE_CRC32C(memoryview(np.empty(len(data) - 1000, np.uint8)), data[1000:], first)
    assert rest == crc32c.crc32c(data.tobytes())


def test_the_native_loop_is_built_on_x86_64() -> None:
    """CI installs from the project's files: on x86-64 the loop must really be there (an
    optional build that silently failed would leave shm transfers on the slower path)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the native loop is x86-64 only")
    assert cd.NATIVE_CRC32C is not None
    assert cd.copy_digest_function("crc32c") is cd.NATIVE_CRC32C


@pytest.mark.parametrize(
    ("way", "copy_digest", "checksum"), _ways(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_bad_buffers_are_refused_and_nothing_is_written(
    way: str, copy_digest: cd.CopyDigest, checksum: str
) -> None:
    dest = np.zeros(16, dtype=np.uint8)
    with pytest.raises(ValueError, match="16"):
        copy_digest(memoryview(dest), np.ones(17, dtype=np.uint8))
    assert not dest.any()
    readonly = memoryview(bytes(16))
    with pytest.raises((TypeError, ValueError)):
        copy_digest(readonly, np.ones(16, dtype=np.uint8))
