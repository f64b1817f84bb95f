"""A leadership lease in a file, for the checkpoint coordinator of a single-machine job.

The recovery library ships Redis and PostgreSQL leases for clusters; the demo runs in embedded
mode with neither, and all its processes share one filesystem, so an ``flock``-guarded JSON file
gives the same guarantees there (holder, expiry, fencing epoch, published state).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

from recovery.checkpoint.lease import LeaseGrant
from recovery.fsio import replace_file


class FileLease:
    """The :class:`recovery.checkpoint.lease.Lease` protocol on one file."""

    def __init__(
        self, path: str | os.PathLike[str], *, name: str = "coordinator", ttl: float = 5.0
    ) -> None:
        if not 0 < ttl <= 3600:
            raise ValueError(f"lease ttl must be in (0, 3600] seconds, got {ttl!r}")
        self.path = Path(path)
        self.name = name
        self.ttl = ttl
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def _update(self, change: Any) -> Any:
        with open(self.path.with_suffix(".lock"), "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                try:
                    data = json.loads(self.path.read_text(encoding="utf-8"))
                except (FileNotFoundError, json.JSONDecodeError):
                    data = {}
                result, new = change(data)
                if new is not None:
                    replace_file(self.path, json.dumps(new).encode(), sync=False)
                return result
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def try_acquire(self, holder: str) -> LeaseGrant | None:
        now = time.time()

        def change(d: dict[str, Any]) -> tuple[LeaseGrant | None, dict[str, Any] | None]:
            if d.get("holder") not in (None, holder) and d.get("expires", 0) > now:
                return None, None
            epoch = int(d.get("epoch", 0)) + (0 if d.get("holder") == holder else 1)
            return LeaseGrant(holder, epoch), {
                **d,
                "holder": holder,
                "epoch": epoch,
                "expires": now + self.ttl,
            }

        result: LeaseGrant | None = self._update(change)
        return result

    def renew(self, holder: str) -> bool:
        now = time.time()

        def change(d: dict[str, Any]) -> tuple[bool, dict[str, Any] | None]:
            if d.get("holder") != holder or d.get("expires", 0) <= now:
                return False, None
            return True, {**d, "expires": now + self.ttl}

        return bool(self._update(change))

    def release(self, holder: str) -> None:
        self._update(
            lambda d: (
                (None, {**d, "holder": None, "expires": 0})
                if d.get("holder") == holder
                else (None, None)
            )
        )

    def current_holder(self) -> str | None:
        now = time.time()
        holder: str | None = self._update(
            lambda d: (d.get("holder") if d.get("expires", 0) > now else None, None)
        )
        return holder

    def publish(self, holder: str, state: dict[str, Any]) -> bool:
        def change(d: dict[str, Any]) -> tuple[bool, dict[str, Any] | None]:
            if d.get("holder") != holder:
                return False, None
            return True, {**d, "state": state}

        return bool(self._update(change))

    def read_state(self) -> dict[str, Any] | None:
        state: dict[str, Any] | None = self._update(lambda d: (d.get("state"), None))
        return state

    def close(self) -> None:
        """Nothing to close: every call opens the file."""
