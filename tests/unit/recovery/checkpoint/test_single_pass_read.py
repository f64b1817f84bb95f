"""Restore at read speed: every byte read once, its checksum verified in that same pass.

Bytes read are measured with the kernel's own count for this process (``rchar`` in
``/proc/self/io``: every byte any read syscall of any of our threads returned), so "read once"
and "chose without reading the data" are asserted on what really happened, not on our code's
say-so.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from recovery.checkpoint import _read, atomic, engine
from recovery.checkpoint.engine import CheckpointEngine
from recovery.checkpoint.errors import CheckpointCorrupt, CheckpointInputError
from recovery.checkpoint.version import VersionVector
from tests.harness.training_state import assert_same, small_training_state

pytestmark = pytest.mark.timeout(60)
V = VersionVector
MIB = 1 << 20


def bytes_read() -> int:
    """Bytes returned by read syscalls of this process so far (all threads)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("/proc/self/io has no rchar line")


def big_state(step: int) -> dict[str, Any]:
    """A small real training state plus 4 MiB of weights, so data bytes dwarf the metadata."""
    state = small_training_state()
    g = torch.Generator().manual_seed(step)
    state["model"] = {**state["model"], "big.weight": torch.randn(MIB, generator=g)}
    state["step"] = step
    return state


def data_bytes(info: engine.CheckpointInfo) -> int:
    return sum(int(e["size"]) for e in info.files.values())


def save(eng: CheckpointEngine, step: int) -> engine.CheckpointInfo:
    return eng.save(big_state(step), version=V(step, 0)).wait(30)


def flip_core(path: Path) -> None:
    with open(path / "core.bin", "r+b") as fh:
        fh.seek(3 * MIB)
        byte = fh.read(1)
        fh.seek(3 * MIB)
        fh.write(bytes([byte[0] ^ 0x10]))


@pytest.fixture
def eng(tmp_path: Path) -> Any:
    e = CheckpointEngine(tmp_path / "ckpt", keep=5)
    yield e
    e.close()


def test_default_checksum_is_crc32c_and_round_trips_bit_exact(eng: CheckpointEngine) -> None:
    info = save(eng, 1)
    assert set(info.files["core.bin"]) == {"size", "crc32c"}
    latest = eng.latest()
    assert latest is not None and latest.path == info.path
    assert_same(big_state(1), eng.load(latest))


def test_latest_then_load_reads_every_byte_once(eng: CheckpointEngine) -> None:
    info = save(eng, 1)
    before = bytes_read()
    latest = eng.latest()
    assert latest is not None
    state = eng.load(latest)
    read = bytes_read() - before
    # Once (plus the marker, read by both calls): a verify pass and then a load pass was 2x.
    assert data_bytes(info) <= read < data_bytes(info) * 1.1, (read, data_bytes(info))
    assert_same(big_state(1), state)
    # The bytes were handed over once: a second load reads the files again, never shares them.
    again = eng.load(latest)
    assert again["model"]["big.weight"].data_ptr() != state["model"]["big.weight"].data_ptr()


def test_choosing_by_marker_reads_no_data(eng: CheckpointEngine) -> None:
    save(eng, 1)
    second = save(eng, 2)
    before = bytes_read()
    chosen = eng.latest(verify="sizes")
    assert chosen is not None and chosen.path == second.path
    assert bytes_read() - before < data_bytes(second) // 10


def test_torn_newest_is_refused_by_its_sizes_without_reading_it(eng: CheckpointEngine) -> None:
    first = save(eng, 1)
    second = save(eng, 2)
    with open(second.path / "core.bin", "r+b") as fh:
        fh.truncate(100)
    before = bytes_read()
    chosen = eng.latest(verify="sizes")
    assert bytes_read() - before < data_bytes(first) // 10
    assert chosen is not None and chosen.path == first.path
    assert [s.name for s in chosen.skipped] == [second.path.name]
    assert "core.bin is 100 bytes" in chosen.skipped[0].reason


def test_load_latest_detects_corruption_in_its_single_pass_and_falls_back(
    eng: CheckpointEngine,
) -> None:
    first = save(eng, 1)
    second = save(eng, 2)
    flip_core(second.path)  # same size: only the checksum can tell
    before = bytes_read()
    found = eng.load_latest()
    read = bytes_read() - before
    assert found is not None
    info, state = found
    assert info.path == first.path
    assert [s.name for s in info.skipped] == [second.path.name]
    assert "checksum mismatch in core.bin" in info.skipped[0].reason
    assert eng.last_skipped == info.skipped
    assert_same(big_state(1), state)
    # The damaged one read once (refused on its checksum), the good one read once.
    both = data_bytes(first) + data_bytes(second)
    assert both <= read < both * 1.1, (read, both)


def test_load_latest_refuses_everything_damaged_and_returns_none(eng: CheckpointEngine) -> None:
    only = save(eng, 1)
    flip_core(only.path)
    assert eng.load_latest() is None
    assert [s.name for s in eng.last_skipped] == [only.path.name]
    assert "checksum mismatch" in eng.last_skipped[0].reason
    with pytest.raises(CheckpointCorrupt, match="checksum mismatch in core.bin"):
        eng.load(only, verify="full")


def test_load_latest_honours_not_after_and_layers(eng: CheckpointEngine) -> None:
    save(eng, 1)
    newest = eng.save({**big_state(2), "experience_buffer": torch.ones(8)}, version=V(2, 0))
    newest.wait(30)
    found = eng.load_latest(not_after=V(1, 0))
    assert found is not None and found[0].version == V(1, 0)
    assert "not at or before" in found[0].skipped[0].reason
    core_only = eng.load_latest(layers=["core"])
    assert core_only is not None and "experience_buffer" not in core_only[1]
    with pytest.raises(CheckpointInputError, match="cannot load layer 'transient'"):
        eng.load_latest(layers=["transient"])
    with pytest.raises(CheckpointInputError, match="verify must be 'full' or 'sizes'"):
        eng.latest(verify="bytes")  # type: ignore[arg-type]


@pytest.mark.parametrize("algorithm", ["sha256", "crc32"])
def test_checkpoints_of_the_older_checksums_still_load_and_verify(
    tmp_path: Path, algorithm: str
) -> None:
    old = CheckpointEngine(tmp_path / "ckpt", checksum=algorithm)  # type: ignore[arg-type]
    written = old.save(big_state(1), version=V(1, 0)).wait(30)
    old.close()
    assert set(written.files["core.bin"]) == {"size", algorithm}
    reader = CheckpointEngine(tmp_path / "ckpt")  # today's default, crc32c
    found = reader.load_latest()
    assert found is not None
    assert_same(big_state(1), found[1])
    flip_core(written.path)
    assert reader.load_latest() is None
    assert "checksum mismatch in core.bin" in reader.last_skipped[0].reason


def _listed(path: Path, algorithm: str) -> dict[str, Any]:
    digest = atomic.digest_file(path, checksum=algorithm)
    return {path.name: digest.as_json()}


@pytest.mark.parametrize("direct_min", [4096, 1 << 40], ids=["o_direct", "buffered"])
def test_direct_and_buffered_reads_give_the_same_verified_bytes(
    tmp_path: Path, direct_min: int
) -> None:
    # A size that is not a whole number of blocks exercises the tail read beside the aligned bulk.
    payload = os.urandom(5 * 4096 * 4 + 123)
    path = tmp_path / "core.bin"
    path.write_bytes(payload)
    # The O_DIRECT case is only that where the filesystem takes O_DIRECT: make sure it does.
    os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))

    def read(files: dict[str, Any]) -> _read.ReadFile:
        return _read.read_file(
            tmp_path, "core.bin", files, verify=True, chunk=4 * 4096, direct_min=direct_min
        )

    for algorithm in ("crc32c", "sha256", "crc32"):
        files = _listed(path, algorithm)
        got = read(files)
        assert bytes(got.data.numpy()) == payload and got.verified
        assert got.stat[0] == path.stat().st_ino
        for damaged_at in (4096 * 6, len(payload) - 5):  # in the bulk, in the tail
            with open(path, "r+b") as fh:
                fh.seek(damaged_at)
                fh.write(bytes([payload[damaged_at] ^ 1]))
            with pytest.raises(CheckpointCorrupt, match="checksum mismatch in core.bin"):
                read(files)
            path.write_bytes(payload)
        with open(path, "r+b") as fh:
            fh.truncate(len(payload) - 1)
        with pytest.raises(CheckpointCorrupt, match="bytes, marker says"):
            read(files)
        path.write_bytes(payload)


def test_latest_without_keeping_bytes_still_verifies_everything(eng: CheckpointEngine) -> None:
    first = save(eng, 1)
    second = save(eng, 2)
    flip_core(second.path)
    chosen = eng.latest(keep_bytes=False)
    assert chosen is not None and chosen.path == first.path
    assert "checksum mismatch in core.bin" in chosen.skipped[0].reason
    assert eng._prefetched is None  # nothing held for a load that will not come
    # The load that does come reads (without re-hashing: unchanged since latest() hashed it).
    before = bytes_read()
    assert_same(big_state(1), eng.load(chosen))
    assert bytes_read() - before >= data_bytes(first)


def test_a_device_refusing_the_direct_reads_falls_back_to_buffered(tmp_path: Path) -> None:
    # A chunk that is not a whole number of blocks makes the kernel refuse the O_DIRECT reads
    # (EINVAL), as a device wanting a larger alignment would: the file is read again through
    # the page cache with a fresh checksum, and verifies.
    payload = os.urandom(64 * 4096 + 7)
    path = tmp_path / "core.bin"
    path.write_bytes(payload)
    files = _listed(path, "crc32c")
    got = _read.read_file(
        tmp_path, "core.bin", files, verify=True, chunk=4 * 4096 + 1, direct_min=4096
    )
    assert bytes(got.data.numpy()) == payload
    with open(path, "r+b") as fh:
        fh.seek(100)
        fh.write(bytes([payload[100] ^ 4]))
    with pytest.raises(CheckpointCorrupt, match="checksum mismatch in core.bin"):
        _read.read_file(
            tmp_path, "core.bin", files, verify=True, chunk=4 * 4096 + 1, direct_min=4096
        )
