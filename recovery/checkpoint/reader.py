"""The reader side of a checkpoint root: choose the newest checkpoint that verifies and load it,
every byte read once with its checksum verified in that same pass (docs/checkpoints.md).

:class:`CheckpointReader` holds no lock and writes nothing; :class:`~recovery.checkpoint.engine.
CheckpointEngine` is a reader too (it adds the writer side). ``latest()`` chooses (reading the
chosen checkpoint's files once and keeping the verified bytes for the ``load()`` that follows, or
with ``verify="sizes"`` reading no data at all), ``load()`` loads, and ``load_latest()`` is the
restore path: choose by marker, load with full verification, fall back to the next older
checkpoint when the load refuses one.

The bytes ``latest()`` keeps are per reader. Several threads calling ``latest()``/``load()`` on
one reader stay correct (a ``load()`` takes kept bytes only for its own checkpoint, with every
file's inode, size and mtime unchanged since they were verified) but may read a file twice.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from recovery.checkpoint import _serialize, atomic
from recovery.checkpoint._read import ReadFile, check_sizes, read_files
from recovery.checkpoint.errors import CheckpointCorrupt, CheckpointInputError
from recovery.checkpoint.layout import MANIFEST, MARKER, list_dirs, stat_key
from recovery.checkpoint.version import Ordering, VersionVector, WeightVersionTable

log = logging.getLogger("rlguard.recovery.checkpoint")

Layer = Literal["core", "aux", "transient"]
PERSISTED_LAYERS: tuple[Layer, ...] = ("core", "aux")


@dataclass(frozen=True)
class SkippedCheckpoint:
    """A checkpoint directory that ``latest()`` passed over, and why."""

    name: str
    reason: str


@dataclass(frozen=True)
class CheckpointInfo:
    """A committed checkpoint as described by its marker."""

    path: Path
    seq: int
    version: VersionVector
    weight_versions: WeightVersionTable
    layers: dict[str, list[str]]
    transient: list[str]
    created_at: float
    files: dict[str, dict[str, Any]]
    skipped: tuple[SkippedCheckpoint, ...] = field(default=())
    # (inode, size, mtime_ns) of each file as it was when its checksum verified.
    verified: dict[str, tuple[int, int, int]] = field(default_factory=dict, compare=False)

    @property
    def components(self) -> list[str]:
        """Every persisted component, core first."""
        return [c for layer in PERSISTED_LAYERS for c in self.layers.get(layer, [])]

    @classmethod
    def from_marker(
        cls, path: Path, body: Mapping[str, Any], skipped: tuple[SkippedCheckpoint, ...] = ()
    ) -> CheckpointInfo:
        """Build the info from a verified marker body."""
        meta = body["metadata"]
        try:
            return cls(
                path=path,
                seq=int(meta["seq"]),
                version=VersionVector.from_json(meta["version"]),
                weight_versions=WeightVersionTable.from_json(meta["weight_versions"]),
                layers={str(k): list(v) for k, v in meta["layers"].items()},
                transient=list(meta["transient"]),
                created_at=float(meta["created_at"]),
                files=dict(body["files"]),
                skipped=skipped,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointCorrupt(f"{path.name}: marker metadata is malformed: {exc!r}") from None


class CheckpointReader:
    """Reads the checkpoints under ``root`` (see the module docstring). ``last_skipped``: the
    checkpoints the last ``latest()`` / ``load_latest()`` passed over, and why."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.last_skipped: tuple[SkippedCheckpoint, ...] = ()
        # The files latest() last read and verified, kept for the load() that follows it.
        self._prefetched: tuple[Path, dict[str, ReadFile]] | None = None

    def _candidates(
        self, where: Path, not_after: VersionVector | None, skipped: list[SkippedCheckpoint]
    ) -> Iterator[CheckpointInfo]:
        """Checkpoints under ``where``, newest first, whose marker verifies (and whose version is
        at or before ``not_after``); the others are appended to ``skipped`` with the reason."""
        for _seq, path in sorted(list_dirs(where), reverse=True):
            try:
                body = atomic.read_marker(path, MARKER)
                candidate = CheckpointInfo.from_marker(path, body, tuple(skipped))
                if not_after is not None and candidate.version.compare(not_after) not in (
                    Ordering.EQUAL,
                    Ordering.BEHIND,
                ):
                    raise CheckpointCorrupt(
                        f"{path.name}: version {candidate.version} is not at or before the "
                        f"committed global version {not_after} (its round never committed)"
                    )
            except CheckpointCorrupt as exc:
                self._skip(skipped, path, exc)
                continue
            yield candidate

    @staticmethod
    def _skip(skipped: list[SkippedCheckpoint], path: Path, exc: CheckpointCorrupt) -> None:
        skipped.append(SkippedCheckpoint(path.name, str(exc)))
        log.warning("skipping checkpoint %s: %s", path.name, exc)

    def latest(
        self,
        *,
        valid_only: bool = True,
        root: Path | None = None,
        not_after: VersionVector | None = None,
        verify: Literal["full", "sizes"] = "full",
        keep_bytes: bool = True,
    ) -> CheckpointInfo | None:
        """The newest checkpoint whose marker and files verify (``valid_only=False``: whose
        marker merely parses). Skipped directories and the reasons are in ``info.skipped`` and
        ``self.last_skipped``. ``root`` selects the mirror instead of the local root.
        ``not_after`` skips checkpoints whose version is not at or before it (used on restore
        with the coordinator's committed global version: anything newer came from a round that
        never committed).

        ``verify="full"`` (the default) reads every file of the chosen checkpoint once, checksums
        verified as the bytes arrive, and keeps those verified bytes for the ``load()`` that
        normally follows (until it takes them, the next ``latest()`` or ``close()``), so
        ``latest()`` + ``load()`` reads each byte exactly once. Older candidates are read only
        when every newer one was refused. ``verify="sizes"`` reads no data at all: the marker
        verifies and every file it lists exists with the recorded size (a torn checkpoint is
        refused); the checksums are then checked by ``load()`` in its single read pass, which
        refuses a damaged file before returning anything. :meth:`load_latest` does that and
        falls back to older checkpoints when the load refuses one. ``keep_bytes=False``: a
        caller that only wants to know which checkpoint is valid (and will not load it here)
        has the files streamed through a small buffer instead of held in memory.
        """
        if verify not in ("full", "sizes"):
            raise CheckpointInputError(f"verify must be 'full' or 'sizes', got {verify!r}")
        where = self.root if root is None else Path(root)
        skipped: list[SkippedCheckpoint] = []
        found: CheckpointInfo | None = None
        self._prefetched = None  # whatever an earlier latest() kept is stale now
        for candidate in self._candidates(where, not_after, skipped):
            if valid_only:
                try:
                    check_sizes(candidate.path, candidate.files, sorted(candidate.files))
                    if verify == "full" and not keep_bytes:
                        stats = {name: stat_key(candidate.path / name) for name in candidate.files}
                        atomic.verify_committed_dir(candidate.path, MARKER)
                        candidate = dataclasses.replace(candidate, verified=stats)
                    elif verify == "full":
                        read = read_files(
                            candidate.path,
                            sorted(candidate.files),
                            candidate.files,
                            verify=dict.fromkeys(candidate.files, True),
                        )
                        candidate = dataclasses.replace(
                            candidate, verified={n: r.stat for n, r in read.items()}
                        )
                        self._prefetched = (candidate.path, read)
                except CheckpointCorrupt as exc:
                    self._skip(skipped, candidate.path, exc)
                    continue
            found = dataclasses.replace(candidate, skipped=tuple(skipped))
            break
        self.last_skipped = tuple(skipped)
        return found

    def load_latest(
        self,
        *,
        layers: Iterable[str] = PERSISTED_LAYERS,
        root: Path | None = None,
        not_after: VersionVector | None = None,
        map_location: str | torch.device = "cpu",
    ) -> tuple[CheckpointInfo, dict[str, Any]] | None:
        """Load the newest checkpoint that verifies, reading each byte once: the restore path.

        Candidates are tried newest first. Each is chosen by its marker alone (it verifies, the
        version is at or before ``not_after``, every file it lists exists with the recorded size:
        no data is read to choose), then loaded with ``load(verify="full")``, whose single read
        pass checks the checksum of every file it reads (the manifest and the requested
        ``layers``). A candidate refused by either step is recorded in ``info.skipped`` /
        ``self.last_skipped`` and the next older one is tried; nothing from a refused candidate
        is returned. Returns ``(info, state)``, or None when no checkpoint verifies.
        """
        wanted = self._check_layers_arg(layers)
        where = self.root if root is None else Path(root)
        skipped: list[SkippedCheckpoint] = []
        self._prefetched = None
        result: tuple[CheckpointInfo, dict[str, Any]] | None = None
        for candidate in self._candidates(where, not_after, skipped):
            try:
                check_sizes(candidate.path, candidate.files, sorted(candidate.files))
                state = self.load(
                    candidate, layers=wanted, verify="full", map_location=map_location
                )
            except CheckpointCorrupt as exc:
                self._skip(skipped, candidate.path, exc)
                continue
            result = (dataclasses.replace(candidate, skipped=tuple(skipped)), state)
            break
        self.last_skipped = tuple(skipped)
        return result

    def list_committed(self) -> list[Path]:
        """Final checkpoint directories under the root, oldest first (not verified)."""
        return [p for _, p in sorted(list_dirs(self.root))]

    @staticmethod
    def _check_layers_arg(layers: Iterable[str]) -> list[str]:
        wanted = list(layers)
        for layer in wanted:
            if layer not in PERSISTED_LAYERS:
                raise CheckpointInputError(
                    f"cannot load layer {layer!r}: only {list(PERSISTED_LAYERS)} are persisted"
                )
        return wanted

    def load(
        self,
        info: CheckpointInfo,
        *,
        layers: Iterable[str] = PERSISTED_LAYERS,
        verify: Literal["if-changed", "full", "none"] = "if-changed",
        map_location: str | torch.device = "cpu",
    ) -> dict[str, Any]:
        """Read the components of the requested ``layers`` from ``info``'s checkpoint.

        Every file is read once (concurrently, in large chunks, into one buffer per file) and
        checked against the marker's size and checksum as its bytes arrive, so a checkpoint
        damaged after ``latest()`` still never loads. ``verify="if-changed"`` (the default)
        takes the bytes ``latest()`` already read and verified when the file's inode, size and
        mtime are still what they were then (no second read), and otherwise reads and verifies
        the file again; ``"full"`` always reads and verifies; ``"none"`` checks sizes only.
        Tensors of one layer are views into one buffer per layer; clone them if they must
        outlive the rest. Raises :class:`CheckpointCorrupt` (and returns nothing) on any
        mismatch.
        """
        if verify not in ("if-changed", "full", "none"):
            raise CheckpointInputError(
                f"verify must be 'if-changed', 'full' or 'none', got {verify!r}"
            )
        wanted = self._check_layers_arg(layers)
        prefetched: dict[str, ReadFile] = {}
        if self._prefetched is not None and self._prefetched[0] == info.path:
            prefetched = self._prefetched[1]
            self._prefetched = None  # handed over once: two loads never share one buffer

        def must_hash(name: str) -> bool:
            if verify == "none":
                return False
            known = info.verified.get(name)
            return verify == "full" or known is None or known != stat_key(info.path / name)

        body = atomic.read_marker(info.path, MARKER)
        files: dict[str, Any] = body["files"]
        names = [MANIFEST] + [f"{layer}.bin" for layer in wanted if info.layers.get(layer)]
        got: dict[str, torch.Tensor] = {}
        to_read: dict[str, bool] = {}
        for name in names:
            early = prefetched.get(name)
            if (
                early is not None
                and verify != "full"
                and early.stat == stat_key(info.path / name)
                and early.stat == info.verified.get(name)
            ):
                got[name] = early.data  # verified by latest() and unchanged since
            else:
                to_read[name] = must_hash(name)
        if to_read:
            read = read_files(info.path, list(to_read), files, verify=to_read)
            got.update({n: r.data for n, r in read.items()})
        try:
            manifest = json.loads(got[MANIFEST].numpy().tobytes())
        except ValueError as exc:
            raise CheckpointCorrupt(f"{info.path.name}: manifest is not JSON: {exc}") from None
        out: dict[str, Any] = {}
        for layer in wanted:
            layer_names = info.layers.get(layer, [])
            if not layer_names:
                continue
            buffer = got[f"{layer}.bin"]
            try:
                slots = [_serialize.TensorSlot.from_json(s) for s in manifest["slots"][layer]]
                tensors = _serialize.views_of(buffer, slots)
                if str(map_location) != "cpu":
                    tensors = [t.to(map_location) for t in tensors]
                for name in layer_names:
                    out[name] = _serialize.decode(manifest["components"][name]["value"], tensors)
            except (KeyError, IndexError, TypeError) as exc:
                raise CheckpointCorrupt(
                    f"{info.path.name}: manifest is inconsistent: {exc!r}"
                ) from None
        return out
