"""What one process can serve: the weight-set versions it holds, complete or still arriving.

A relay serves chunks of a version while it is still receiving it (each chunk only once it was
verified), which is what lets a fan-out run as a pipeline instead of in rounds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from recovery.transfer.manifest import WeightManifest, chunk_views

PARTIAL = "partial"
COMPLETE = "complete"
DROPPED = "dropped"


@dataclass
class Buffers:
    """Tensors a transport placed in memory it can serve from, plus what a peer needs to read them.

    ``extra`` travels with the manifest (the shm transport puts its segment path there);
    ``release`` frees transport resources once nothing serves or reads the tensors any more.
    """

    tensors: dict[str, torch.Tensor]
    extra: dict[str, Any] = field(default_factory=dict)
    release: Callable[[], None] = lambda: None


class ServedVersion:
    """One version held by this process, with a per-chunk readiness map for partial serving."""

    def __init__(
        self,
        manifest: WeightManifest,
        buffers: Buffers,
        *,
        complete: bool,
        views: list[memoryview] | None = None,
    ) -> None:
        """``views``: the chunk views of ``buffers`` for ``manifest``, when the caller made
        them already (and so checked that the manifest fits)."""
        if views is None:
            manifest.check_fits(buffers.tensors)
            views = chunk_views(manifest, buffers.tensors)
        self.manifest = manifest
        self.buffers = buffers
        self.views = views
        self._cond = threading.Condition()
        self._ready = bytearray([1 if complete else 0] * len(manifest.chunks))
        self._state = COMPLETE if complete else PARTIAL
        self.served_chunks = 0

    @property
    def state(self) -> str:
        """``partial``, ``complete`` or ``dropped``."""
        with self._cond:
            return self._state

    def mark_ready(self, index: int) -> None:
        """Chunk ``index`` was verified and may be served."""
        with self._cond:
            self._ready[index] = 1
            self._cond.notify_all()

    def mark_complete(self) -> None:
        """Every chunk is present and verified."""
        with self._cond:
            self._ready = bytearray([1] * len(self._ready))
            self._state = COMPLETE
            self._cond.notify_all()

    def drop(self) -> None:
        """Stop serving: waiters wake up and are told the source gave up."""
        with self._cond:
            self._state = DROPPED
            self._cond.notify_all()

    def wait_ready(self, index: int, *, timeout: float) -> str:
        """Wait until chunk ``index`` is ready; returns ``ready``, ``dropped`` or ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self._state == DROPPED:
                    return "dropped"
                if self._ready[index]:
                    return "ready"
                left = deadline - time.monotonic()
                if left <= 0:
                    return "timeout"
                self._cond.wait(left)

    def count_served(self) -> None:
        """Count one chunk sent to a peer (for stats: proves what was re-sent)."""
        with self._cond:
            self.served_chunks += 1


class WeightStore:
    """Thread-safe map (name, version) → :class:`ServedVersion`."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._versions: dict[tuple[str, int], ServedVersion] = {}
        self._expected: set[tuple[str, int]] = set()

    def expect(self, name: str, version: int) -> None:
        """This process is about to receive ``version``: manifest requests wait for it.

        A receiver announces itself as a source before it knows the manifest, so receivers that
        start together can form a relay chain at once instead of all picking the publisher.
        """
        with self._lock:
            self._expected.add((name, version))

    def add(self, served: ServedVersion) -> None:
        """Start serving ``served`` (replaces nothing: a version is added once)."""
        key = (served.manifest.name, served.manifest.version)
        with self._lock:
            if key in self._versions:
                raise KeyError(f"{key[0]!r} v{key[1]} is already served")
            self._versions[key] = served
            self._expected.discard(key)
            self._lock.notify_all()

    def wait_for(self, name: str, version: int, *, timeout: float) -> ServedVersion | None:
        """The held version; waits up to ``timeout`` while it is expected but not here yet."""
        key = (name, version)
        deadline = time.monotonic() + timeout
        with self._lock:
            while key not in self._versions and key in self._expected:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(left)
            return self._versions.get(key)

    def get(self, name: str, version: int) -> ServedVersion | None:
        """The held version, or None."""
        with self._lock:
            return self._versions.get((name, version))

    def remove(self, name: str, version: int) -> ServedVersion | None:
        """Stop serving a version; in-flight readers are told the source gave up."""
        with self._lock:
            served = self._versions.pop((name, version), None)
            self._expected.discard((name, version))
            self._lock.notify_all()
        if served is not None:
            served.drop()
        return served

    def stats(self) -> Mapping[str, dict[str, Any]]:
        """Per held version: state and how many chunks were served to peers."""
        with self._lock:
            items = list(self._versions.items())
        return {
            f"{name}@{version}": {"state": s.state, "served_chunks": s.served_chunks}
            for (name, version), s in items
        }
