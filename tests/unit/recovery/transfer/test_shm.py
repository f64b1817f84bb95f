"""The shm transport's read path: fused copy + checksum, kept mappings, recycled segments."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest
import torch

from recovery.transfer import TransferConfigError
from recovery.transfer.copy_digest import COPY_BLOCK_BYTES, copy_digest_function
from recovery.transfer.errors import ProtocolError
from recovery.transfer.manifest import CHECKSUMS, TensorSpec, build_manifest, byte_view, chunk_views
from recovery.transfer.shm import MAX_CACHED_MAPPINGS, ShmTransport


def _tensors(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    # "big" spans several copy blocks and ends in a partial one; "small" is under one block.
    big = torch.randint(
        -(2**62), 2**62, ((COPY_BLOCK_BYTES * 5 // 2 + 24) // 8,), generator=generator
    )
    small = torch.randn(37, 3, generator=generator).to(torch.bfloat16)
    return {"big": big, "small": small}


@pytest.mark.parametrize("checksum", sorted(CHECKSUMS))
def test_read_and_digest_copies_and_checksums_what_landed(tmp_path: Path, checksum: str) -> None:
    shm = ShmTransport(shm_dir=tmp_path)
    source = _tensors(1)
    buffers = shm.adopt(source, tag="v1")
    manifest = build_manifest(
        "policy", 1, source, chunk_bytes=COPY_BLOCK_BYTES * 2 + 8, checksum=checksum
    )
    dest = {name: torch.zeros_like(t) for name, t in source.items()}
    views = chunk_views(manifest, dest)
    reader = shm.open_payload(buffers.extra)
    try:
        for chunk, view in zip(manifest.chunks, views, strict=True):
            name = manifest.tensors[chunk.tensor].name
            assert (
                reader.read_and_digest(view, name, chunk.offset, copy_digest_function(checksum))
                == chunk.checksum
            )
        assert all(torch.equal(dest[n], source[n]) for n in source)
        with pytest.raises(ProtocolError, match="past the segment"):
            reader.read_and_digest(views[0], "small", 8, copy_digest_function(checksum))
    finally:
        reader.close()
        buffers.release()
        shm.close()
    assert not list(tmp_path.iterdir())


def test_a_mapping_is_kept_between_pulls_and_dropped_once_its_segment_is_gone(
    tmp_path: Path,
) -> None:
    source_side, reader_side = ShmTransport(shm_dir=tmp_path), ShmTransport(shm_dir=tmp_path)
    buffers = source_side.allocate([TensorSpec("w", "int64", (64,))], tag="slot0")
    buffers.tensors["w"].copy_(torch.arange(64))
    name = buffers.extra["shm_path"]
    dest = torch.empty(64, dtype=torch.int64)

    first = reader_side.open_payload(buffers.extra)
    first.close()
    second = reader_side.open_payload(buffers.extra)
    assert second._mapping is first._mapping  # the same mapping, still warm
    second.read_into(byte_view(dest), "w", 0)
    assert torch.equal(dest, torch.arange(64))
    second.close()
    assert reader_side.cached_mappings == [name]

    # A reader still open when the segment goes keeps its mapping until it is done.
    third = reader_side.open_payload(buffers.extra)
    buffers.release()
    third.read_into(byte_view(dest), "w", 0)
    assert torch.equal(dest, torch.arange(64))
    third.close()
    assert reader_side.cached_mappings == []


def test_a_new_file_under_a_known_name_is_mapped_afresh(tmp_path: Path) -> None:
    shm = ShmTransport(shm_dir=tmp_path)
    path = tmp_path / f"rlg-xfer-{os.getpid()}-fake_1"
    path.write_bytes(bytes(range(64)))
    extra = {"shm_path": path.name, "offsets": {"t": 0}, "size": 64}
    reader = shm.open_payload(extra)
    reader.close()
    path.unlink()
    path.write_bytes(bytes(range(100, 164)))  # same name, another inode
    reader = shm.open_payload(extra)
    try:
        dest = bytearray(4)
        reader.read_into(memoryview(dest), "t", 0)
        assert bytes(dest) == bytes(range(100, 104))
    finally:
        reader.close()
        shm.close()


def test_idle_mappings_are_bounded(tmp_path: Path) -> None:
    shm = ShmTransport(shm_dir=tmp_path)
    segments = [
        shm.allocate([TensorSpec("w", "uint8", (8,))], tag=f"s{i}")
        for i in range(MAX_CACHED_MAPPINGS + 2)
    ]
    for buffers in segments:
        shm.open_payload(buffers.extra).close()
    assert shm.cached_mappings == [b.extra["shm_path"] for b in segments[-MAX_CACHED_MAPPINGS:]]
    for buffers in segments:
        buffers.release()
    shm.close()
    assert shm.cached_mappings == [] and not list(tmp_path.iterdir())


def test_a_retired_segment_is_recycled_for_the_next_version_of_the_same_layout(
    tmp_path: Path,
) -> None:
    shm = ShmTransport(shm_dir=tmp_path, recycle_segments=1)
    v1 = shm.adopt(_tensors(1), tag="policy-v1")
    v2 = shm.adopt(_tensors(2), tag="policy-v2")
    assert v1.extra["shm_path"] != v2.extra["shm_path"]
    v1.release()
    assert shm.recycled_segments == [v1.extra["shm_path"]]
    v3_source = _tensors(3)
    v3 = shm.adopt(v3_source, tag="policy-v3")
    assert v3.extra["shm_path"] == v1.extra["shm_path"] and shm.recycled_segments == []
    assert all(torch.equal(v3.tensors[n], v3_source[n]) for n in v3_source)

    other = shm.adopt({"x": torch.ones(3)}, tag="other")  # another layout: a new segment
    assert other.extra["shm_path"] not in (v1.extra["shm_path"], v2.extra["shm_path"])
    v2.release()
    other.release()  # the pool holds one: this one is unlinked
    assert shm.recycled_segments == [v2.extra["shm_path"]]
    assert not (tmp_path / other.extra["shm_path"]).exists()
    shm.close()  # unlinks what it kept for reuse
    assert sorted(p.name for p in tmp_path.iterdir()) == [v3.extra["shm_path"]]
    v3.release()
    assert not list(tmp_path.iterdir())


def test_a_reader_of_a_retired_version_cannot_mistake_its_successor_for_it(tmp_path: Path) -> None:
    publisher, reader_side = ShmTransport(shm_dir=tmp_path), ShmTransport(shm_dir=tmp_path)
    old = _tensors(1)
    manifest = build_manifest("policy", 1, old)
    v1 = publisher.adopt(old, tag="policy-v1")
    reader = reader_side.open_payload(v1.extra)  # a slow puller of v1 ...
    v1.release()  # ... while the trainer retires v1 and reuses its segment for v2
    v2 = publisher.adopt(_tensors(2), tag="policy-v2")
    assert v2.extra["shm_path"] == v1.extra["shm_path"]
    chunk = manifest.chunks[0]
    dest = torch.empty(chunk.length, dtype=torch.uint8)
    got = reader.read_and_digest(
        byte_view(dest),
        manifest.tensors[chunk.tensor].name,
        chunk.offset,
        copy_digest_function(manifest.checksum),
    )
    assert got != chunk.checksum  # verification rejects it; the receiver re-fetches elsewhere
    reader.close()
    v2.release()
    publisher.close()
    reader_side.close()
    assert not list(tmp_path.iterdir())


def test_bad_locations_and_options_are_refused(tmp_path: Path) -> None:
    shm = ShmTransport(shm_dir=tmp_path)
    buffers = shm.allocate([TensorSpec("w", "uint8", (8,))], tag="s")
    name = buffers.extra["shm_path"]
    for extra in (
        {"shm_path": name, "offsets": {"w": -8}, "size": 8},
        {"shm_path": name, "offsets": {"w": "0"}, "size": 8},
        {"shm_path": name, "offsets": {"w": 0}, "size": -1},
    ):
        with pytest.raises(ProtocolError, match="bad shared-memory location"):
            shm.open_payload(extra)
    with pytest.raises(ProtocolError, match="smaller than announced"):
        shm.open_payload({"shm_path": name, "offsets": {"w": 0}, "size": 1 << 20})
    assert shm.cached_mappings == []
    buffers.release()
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(TransferConfigError, match="recycle_segments"):
            ShmTransport(shm_dir=tmp_path, recycle_segments=bad)  # type: ignore[arg-type]


def test_crc_can_be_continued_block_by_block() -> None:
    data = os.urandom(3 * 1000 + 7)
    for digest_of in CHECKSUMS.values():
        value = 0
        for start in range(0, len(data), 1000):
            value = digest_of(memoryview(data)[start : start + 1000], value)
        assert value == digest_of(memoryview(data))
    assert CHECKSUMS["crc32"](memoryview(data)) == zlib.crc32(data)


@pytest.mark.parametrize("checksum", sorted(CHECKSUMS))
def test_adopt_digested_checksums_the_copy_as_the_manifest_would(
    tmp_path: Path, checksum: str
) -> None:
    # The publisher's one pass (copy into the segment + checksum of the copy) must give the very
    # manifest a separate checksum pass over the trainer's tensors gives.
    shm = ShmTransport(shm_dir=tmp_path)
    source = {**_tensors(3), "empty": torch.empty(0)}
    chunk_bytes = COPY_BLOCK_BYTES + 24
    buffers, digests = shm.adopt_digested(
        source, tag="v1", chunk_bytes=chunk_bytes, checksum=checksum
    )
    try:
        assert all(torch.equal(buffers.tensors[n], source[n]) for n in source)
        fused = build_manifest(
            "policy",
            1,
            buffers.tensors,
            chunk_bytes=chunk_bytes,
            checksum=checksum,
            digests=digests,
        )
        assert fused == build_manifest(
            "policy", 1, source, chunk_bytes=chunk_bytes, checksum=checksum
        )
        with pytest.raises(TransferConfigError, match="checksums given"):
            build_manifest(
                "policy",
                1,
                source,
                chunk_bytes=chunk_bytes,
                checksum=checksum,
                digests=digests[:-1],
            )
    finally:
        buffers.release()
        shm.close()
