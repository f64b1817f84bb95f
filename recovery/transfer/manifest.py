"""Weight-set manifests: what a version contains and how it is cut into checksummed chunks.

A weight set is a named version of tensors. The publisher describes it once in a manifest (every
tensor's name, dtype, shape and the crc32 of every chunk) and sends the manifest before any data,
so a receiver can check that its preallocated tensors fit and can verify each chunk as it lands,
whichever relay it came from.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

import torch

from recovery.transfer.errors import (
    ManifestMismatchError,
    NonContiguousTensorError,
    ProtocolError,
    TransferConfigError,
)

DEFAULT_CHUNK_BYTES = 4 << 20
MAX_CHUNK_BYTES = 1 << 30

# Every dtype a weight set may carry, by a stable wire name (torch's repr is not a contract).
DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "float64": torch.float64,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}
_DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}

NonContiguousPolicy = Literal["copy", "refuse"]


class Checksum(Protocol):
    """A chunk checksum: ``digest(data)``, or ``digest(more, digest(data))`` to continue one."""

    def __call__(self, data: memoryview, value: int = 0, /) -> int: ...


def _available_checksums() -> dict[str, Checksum]:
    found: dict[str, Checksum] = {"crc32": zlib.crc32}
    try:
        # Hardware CRC32C (SSE4.2 / ARMv8) when the optional ``crc32c`` package is installed:
        # verification is on the receiver's critical path, and zlib's crc32 is slower.
        found["crc32c"] = cast(Checksum, importlib.import_module("crc32c").crc32c)
    except ImportError:
        pass
    return found


CHECKSUMS = _available_checksums()
DEFAULT_CHECKSUM = "crc32c" if "crc32c" in CHECKSUMS else "crc32"


def checksum_function(name: str) -> Checksum:
    """The chunk checksum called ``name``; a clear error when it is not available here."""
    try:
        return CHECKSUMS[name]
    except KeyError:
        raise TransferConfigError(
            f"checksum {name!r} is not available in this process; available: {sorted(CHECKSUMS)}"
            + (" (install the 'crc32c' package)" if name == "crc32c" else "")
        ) from None


def dtype_name(dtype: torch.dtype) -> str:
    """The wire name of ``dtype``; raises :class:`TransferConfigError` for unsupported dtypes."""
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise TransferConfigError(
            f"dtype {dtype} cannot be transferred; supported: {sorted(DTYPES)}"
        ) from None


def byte_view(tensor: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor's memory (no copy)."""
    if tensor.device.type != "cpu":
        raise TransferConfigError(f"tensor on {tensor.device} cannot be viewed as host memory")
    if not tensor.is_contiguous():
        raise NonContiguousTensorError("byte_view needs a contiguous tensor")
    if tensor.numel() == 0:
        return memoryview(bytearray())
    # Viewed as bytes without flattening first (a 0-d tensor has no last dimension to view):
    # a few hundred of these run per refit, and every torch call here costs microseconds.
    raw = tensor.view(torch.uint8) if tensor.dim() else tensor.reshape(1).view(torch.uint8)
    return raw.numpy().data.cast("B")


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a weight set: its name, dtype (wire name) and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Size of the tensor's data in bytes."""
        count = 1
        for dim in self.shape:
            count *= dim
        return count * DTYPES[self.dtype].itemsize

    @staticmethod
    def of(name: str, tensor: torch.Tensor) -> TensorSpec:
        """The spec of ``tensor`` under ``name``."""
        return TensorSpec(name, dtype_name(tensor.dtype), tuple(int(d) for d in tensor.shape))

    def empty(self, *, pin_memory: bool = False) -> torch.Tensor:
        """A new uninitialised CPU tensor that matches this spec."""
        return torch.empty(self.shape, dtype=DTYPES[self.dtype], pin_memory=pin_memory)


@dataclass(frozen=True)
class ChunkRef:
    """One checksummed slice of one tensor's bytes."""

    index: int
    tensor: int
    offset: int
    length: int
    checksum: int


@dataclass(frozen=True)
class WeightManifest:
    """A version of a named weight set: its tensors and its chunks, in sending order."""

    name: str
    version: int
    chunk_bytes: int
    tensors: tuple[TensorSpec, ...]
    chunks: tuple[ChunkRef, ...]
    checksum: str = "crc32"

    @property
    def total_bytes(self) -> int:
        """Bytes of tensor data in the whole set."""
        return sum(spec.nbytes for spec in self.tensors)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready form (chunks as compact lists)."""
        return {
            "name": self.name,
            "version": self.version,
            "chunk_bytes": self.chunk_bytes,
            "checksum": self.checksum,
            "tensors": [[t.name, t.dtype, list(t.shape)] for t in self.tensors],
            "chunks": [[c.tensor, c.offset, c.length, c.checksum] for c in self.chunks],
        }

    def digest(self) -> str:
        """sha256 over the canonical JSON form: what the registry records at publish time."""
        blob = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> WeightManifest:
        """Parse and validate a manifest received from a peer."""
        try:
            tensors = tuple(
                TensorSpec(str(n), str(d), tuple(int(x) for x in s)) for n, d, s in data["tensors"]
            )
            chunks = tuple(
                ChunkRef(i, int(t), int(o), int(n), int(c))
                for i, (t, o, n, c) in enumerate(data["chunks"])
            )
            manifest = WeightManifest(
                str(data["name"]),
                int(data["version"]),
                int(data["chunk_bytes"]),
                tensors,
                chunks,
                str(data["checksum"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed manifest: {exc!r}") from exc
        manifest.validate()
        return manifest

    def validate(self) -> None:
        """Check internal consistency: known dtypes, chunks exactly tiling every tensor."""
        if self.checksum not in ("crc32", "crc32c"):
            raise ProtocolError(f"unknown chunk checksum {self.checksum!r}")
        for spec in self.tensors:
            if spec.dtype not in DTYPES:
                raise ProtocolError(f"tensor {spec.name!r} has unknown dtype {spec.dtype!r}")
            if any(d < 0 for d in spec.shape):
                raise ProtocolError(f"tensor {spec.name!r} has a negative dimension {spec.shape}")
        covered = [0] * len(self.tensors)
        for chunk in self.chunks:
            if not 0 <= chunk.tensor < len(self.tensors):
                raise ProtocolError(f"chunk {chunk.index} names tensor {chunk.tensor}")
            if chunk.offset != covered[chunk.tensor] or chunk.length <= 0:
                raise ProtocolError(f"chunk {chunk.index} does not continue its tensor's bytes")
            covered[chunk.tensor] += chunk.length
        for spec, done in zip(self.tensors, covered, strict=True):
            if done != spec.nbytes:
                raise ProtocolError(f"chunks cover {done} of {spec.nbytes} bytes of {spec.name!r}")

    def check_fits(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Raise :class:`ManifestMismatchError` unless ``tensors`` match this manifest exactly."""
        expected = {spec.name for spec in self.tensors}
        if set(tensors) != expected:
            missing = sorted(expected - set(tensors))
            extra = sorted(set(tensors) - expected)
            raise ManifestMismatchError(
                f"weight set {self.name!r} v{self.version}: missing tensors {missing}, "
                f"unexpected tensors {extra}"
            )
        for spec in self.tensors:
            have = TensorSpec.of(spec.name, tensors[spec.name])
            if have != spec:
                raise ManifestMismatchError(
                    f"tensor {spec.name!r}: manifest says {spec.dtype}{list(spec.shape)}, "
                    f"buffer is {have.dtype}{list(have.shape)}"
                )
            if not tensors[spec.name].is_contiguous():
                raise ManifestMismatchError(f"buffer for {spec.name!r} is not contiguous")


def prepare_tensors(
    tensors: Mapping[str, torch.Tensor], *, noncontiguous: NonContiguousPolicy = "copy"
) -> dict[str, torch.Tensor]:
    """Validate tensors for sending: supported dtype, contiguous (copied or refused), on the CPU.

    A CUDA tensor (a trainer's weights where they live) is copied into pinned host memory, all of
    them queued asynchronously and waited for once: the set sent is the weights as they were at
    this call, and the trainer may go on updating its GPU copy. Other devices are refused.
    """
    if noncontiguous not in ("copy", "refuse"):
        raise TransferConfigError(
            f"noncontiguous must be 'copy' or 'refuse', not {noncontiguous!r}"
        )
    ready: dict[str, torch.Tensor] = {}
    staged_from: set[torch.device] = set()
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not name:
            raise TransferConfigError(f"tensor names must be non-empty strings, got {name!r}")
        if not isinstance(tensor, torch.Tensor):
            raise TransferConfigError(f"{name!r} is a {type(tensor).__name__}, not a tensor")
        dtype_name(tensor.dtype)
        if tensor.device.type not in ("cpu", "cuda"):
            raise TransferConfigError(
                f"tensor {name!r} is on {tensor.device}; only CPU and CUDA tensors can be sent"
            )
        if not tensor.is_contiguous():
            if noncontiguous == "refuse":
                raise NonContiguousTensorError(
                    f"tensor {name!r} (shape {list(tensor.shape)}, stride {list(tensor.stride())})"
                    " is not contiguous and the policy is to refuse"
                )
            if tensor.device.type == "cpu":
                # Raw memory of a strided view is not the tensor's logical content: copy it.
                tensor = tensor.contiguous()
        if tensor.device.type == "cuda":
            host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            host.copy_(tensor, non_blocking=True)  # also makes a strided view contiguous
            staged_from.add(tensor.device)
            tensor = host
        ready[name] = tensor
    for device in staged_from:  # each GPU's copies run on its own stream
        torch.cuda.synchronize(device)
    return ready


def build_manifest(
    name: str,
    version: int,
    tensors: Mapping[str, torch.Tensor],
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    checksum: str = DEFAULT_CHECKSUM,
    digests: Sequence[int] | None = None,
) -> WeightManifest:
    """Describe contiguous ``tensors`` as version ``version`` of ``name``, checksumming each chunk
    (``digests``: the chunks' checksums, in order, already taken while the bytes were copied)."""
    digest_of = checksum_function(checksum)
    if not name or not isinstance(name, str):
        raise TransferConfigError(f"weight set name must be a non-empty string, got {name!r}")
    if not isinstance(version, int) or version < 0:
        raise TransferConfigError(f"version must be a non-negative int, got {version!r}")
    if not isinstance(chunk_bytes, int) or not 0 < chunk_bytes <= MAX_CHUNK_BYTES:
        raise TransferConfigError(
            f"chunk_bytes must be in 1..{MAX_CHUNK_BYTES}, got {chunk_bytes!r}"
        )
    if digests is not None:
        count = sum(-(-t.numel() * t.element_size() // chunk_bytes) for t in tensors.values())
        if len(digests) != count:
            raise TransferConfigError(f"{len(digests)} checksums given for {count} chunks")
    specs: list[TensorSpec] = []
    chunks: list[ChunkRef] = []
    for t_index, (t_name, tensor) in enumerate(tensors.items()):
        specs.append(TensorSpec.of(t_name, tensor))
        view = byte_view(tensor)
        for offset in range(0, len(view), chunk_bytes):
            piece = view[offset : offset + chunk_bytes]
            value = digest_of(piece) if digests is None else digests[len(chunks)]
            chunks.append(ChunkRef(len(chunks), t_index, offset, len(piece), value))
    return WeightManifest(name, version, chunk_bytes, tuple(specs), tuple(chunks), checksum)


def chunk_views(manifest: WeightManifest, tensors: Mapping[str, torch.Tensor]) -> list[memoryview]:
    """Writable byte views, one per chunk, into ``tensors`` (which must fit the manifest)."""
    views = [byte_view(tensors[spec.name]) for spec in manifest.tensors]
    return [views[c.tensor][c.offset : c.offset + c.length] for c in manifest.chunks]


def allocate(specs: Sequence[TensorSpec]) -> dict[str, torch.Tensor]:
    """Plain CPU tensors for ``specs`` (what the tcp transport receives into)."""
    return {spec.name: spec.empty() for spec in specs}
