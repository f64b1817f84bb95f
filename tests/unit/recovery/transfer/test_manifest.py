from __future__ import annotations

import importlib
import zlib

import pytest
import torch

from recovery.transfer.errors import (
    ManifestMismatchError,
    NonContiguousTensorError,
    ProtocolError,
    TransferConfigError,
)
from recovery.transfer.manifest import (
    CHECKSUMS,
    DEFAULT_CHECKSUM,
    DTYPES,
    TensorSpec,
    WeightManifest,
    build_manifest,
    byte_view,
    checksum_function,
    chunk_views,
    prepare_tensors,
)


def weights() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return {
        "w": torch.randn(100, 10, generator=gen).to(torch.bfloat16),  # 2000 bytes
        "b": torch.arange(7, dtype=torch.int64),  # 56 bytes
        "empty": torch.empty(0, 4),
    }


def test_chunks_tile_every_tensor_and_carry_crc32() -> None:
    tensors = weights()
    manifest = build_manifest("policy", 3, tensors, chunk_bytes=512)
    assert [(c.tensor, c.offset, c.length) for c in manifest.chunks] == [
        (0, 0, 512),
        (0, 512, 512),
        (0, 1024, 512),
        (0, 1536, 464),
        (1, 0, 56),
    ]
    views = chunk_views(manifest, tensors)
    digest_of = checksum_function(manifest.checksum)
    assert [digest_of(v) for v in views] == [c.checksum for c in manifest.chunks]
    assert manifest.total_bytes == 2056


def test_zlib_crc32_is_always_available_and_crc32c_only_when_installed() -> None:
    manifest = build_manifest("policy", 1, weights(), chunk_bytes=512, checksum="crc32")
    assert manifest.checksum == "crc32"
    assert manifest.chunks[0].checksum == zlib.crc32(chunk_views(manifest, weights())[0])
    assert DEFAULT_CHECKSUM in CHECKSUMS
    try:
        importlib.import_module("crc32c")
        installed = True
    except ImportError:
        installed = False
    if not installed:
        with pytest.raises(TransferConfigError, match="'crc32c' is not available.*install"):
            build_manifest("policy", 1, weights(), checksum="crc32c")
    else:
        assert DEFAULT_CHECKSUM == "crc32c"
        assert build_manifest("policy", 1, weights(), checksum="crc32c").checksum == "crc32c"
    with pytest.raises(TransferConfigError, match="'md5' is not available"):
        build_manifest("policy", 1, weights(), checksum="md5")


def test_json_round_trip_keeps_digest_and_specs() -> None:
    manifest = build_manifest("policy", 3, weights(), chunk_bytes=512)
    again = WeightManifest.from_json(manifest.to_json())
    assert again == manifest
    assert again.digest() == manifest.digest()
    assert again.tensors[0] == TensorSpec("w", "bfloat16", (100, 10))


def test_digest_changes_when_any_chunk_changes() -> None:
    tensors = weights()
    before = build_manifest("policy", 3, tensors).digest()
    tensors["b"][3] += 1
    assert build_manifest("policy", 3, tensors).digest() != before


@pytest.mark.parametrize("dtype", list(DTYPES.values()))
def test_byte_view_is_the_tensor_memory_for_every_dtype(dtype: torch.dtype) -> None:
    tensor = torch.zeros(3, 5, dtype=dtype)
    view = byte_view(tensor)
    assert len(view) == 15 * tensor.element_size()
    view[0] = 1  # writes go to the tensor: no copy
    assert tensor.reshape(-1).view(torch.uint8)[0].item() == 1


def test_noncontiguous_is_copied_or_refused_never_sent_raw() -> None:
    strided = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    ready = prepare_tensors({"t": strided}, noncontiguous="copy")
    assert ready["t"].is_contiguous() and torch.equal(ready["t"], strided)
    with pytest.raises(NonContiguousTensorError, match="'t'.*not contiguous"):
        prepare_tensors({"t": strided}, noncontiguous="refuse")
    with pytest.raises(NonContiguousTensorError):
        byte_view(strided)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "", "version": 1}, "name"),
        ({"name": "p", "version": -1}, "version"),
        ({"name": "p", "version": 1, "chunk_bytes": 0}, "chunk_bytes"),
        ({"name": "p", "version": 1, "chunk_bytes": 2**31}, "chunk_bytes"),
    ],
)
def test_build_manifest_rejects_bad_arguments(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(TransferConfigError, match=match):
        build_manifest(tensors=weights(), **kwargs)  # type: ignore[arg-type]


def test_prepare_rejects_unsupported_dtype_non_tensor_and_bad_policy() -> None:
    with pytest.raises(TransferConfigError, match="complex64"):
        prepare_tensors({"c": torch.zeros(2, dtype=torch.complex64)})
    with pytest.raises(TransferConfigError, match="'x' is a list"):
        prepare_tensors({"x": [1, 2]})  # type: ignore[dict-item]
    with pytest.raises(TransferConfigError, match="noncontiguous"):
        prepare_tensors({}, noncontiguous="ignore")  # type: ignore[arg-type]
    # CUDA tensors are staged (tests/on_gpu); a device with no host copy path is named.
    with pytest.raises(TransferConfigError, match="'m' is on meta; only CPU and CUDA"):
        prepare_tensors({"m": torch.empty(4, device="meta")})


def test_check_fits_names_the_mismatched_tensor() -> None:
    manifest = build_manifest("policy", 1, weights())
    buffers = {k: torch.empty_like(v) for k, v in weights().items()}
    manifest.check_fits(buffers)
    buffers["w"] = torch.empty(100, 10, dtype=torch.float16)
    with pytest.raises(ManifestMismatchError, match="'w'.*bfloat16.*float16"):
        manifest.check_fits(buffers)
    del buffers["b"]
    with pytest.raises(ManifestMismatchError, match=r"missing tensors \['b'\]"):
        manifest.check_fits(buffers)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.pop("chunks"),
        lambda d: d["tensors"][0].__setitem__(1, "float8"),
        lambda d: d["chunks"].pop(1),  # a gap in the tiling
        lambda d: d["chunks"][0].__setitem__(0, 9),  # chunk names a tensor that does not exist
        lambda d: d["tensors"][1].__setitem__(2, [-7]),
        lambda d: d.__setitem__("checksum", "sha1"),
    ],
)
def test_malformed_manifests_from_peers_are_protocol_errors(mutate: object) -> None:
    data = build_manifest("policy", 1, weights(), chunk_bytes=512).to_json()
    mutate(data)  # type: ignore[operator]
    with pytest.raises(ProtocolError):
        WeightManifest.from_json(data)
