"""The bounded on-disk spool: every batch waits here until the server acknowledges it.

Layout of ``directory``:

- ``batches/<seq, 20 digits>.json``: one ingest body per file (without ``sent_at``, which is
  stamped at each delivery), written to a temporary name, fsynced and renamed, so a ``kill -9`` of
  the agent leaves either the whole batch or none of it. Replay order is the ``seq`` order.
- ``state.json``: the agent's identity and counters (``agent_id``, the ``seq`` reservation, the
  drop counts, produced/acknowledged totals), replaced atomically.

Every batch goes through the spool, also when the server is up: the sender thread delivers the
oldest file and deletes it on acknowledgement. This makes the order and the "nothing lost" rule
one mechanism instead of two (a memory queue plus an outage path).

When the spool is over ``max_bytes`` it makes room by dropping, oldest batch first, the GPU and
agent samples (cheap to lose: the next second brings new ones), and only when no such sample is
left, whole batches (job signals last). Every dropped sample is counted (``dropped["spool_full"]``).
A batch being delivered is pinned and never trimmed under the sender; while it still holds GPU
samples the spool may exceed ``max_bytes`` by that one batch rather than drop job signals early.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from recovery.fsio import replace_file
from recovery.protocol.metric_names import is_job_signal

log = logging.getLogger("rlguard.agent.spool")

_SEQ_BLOCK = 1000  # seqs reserved per state write, so a restart never reuses one
_NAME_DIGITS = 20


class SpoolError(Exception):
    """The spool directory cannot be used (the message names the path and the reason)."""


@dataclass
class _Entry:
    seq: int
    size: int
    samples: int
    low_priority: int  # GPU / agent samples still in this batch
    participants: int


@dataclass(frozen=True)
class SpoolStats:
    """A consistent snapshot of the spool and its counters."""

    batches: int
    bytes: int
    samples: int
    dropped: dict[str, int]
    produced_samples: int
    acked_samples: int


def _count(body: dict[str, Any]) -> tuple[int, int, int]:
    samples = body.get("samples", [])
    low = sum(1 for s in samples if not is_job_signal(s["name"]))
    return len(samples), low, len(body.get("participants", []))


class Spool:
    """Bounded, ordered, crash-safe store of unacknowledged batches. Thread-safe.

    ``node`` seeds a new ``agent_id`` (``<node>-<random>``) the first time ``directory`` is used;
    the same directory keeps the same ``agent_id`` and a strictly increasing ``seq`` across
    restarts. ``fsync=False`` trades power-loss safety for less disk traffic (a killed process
    loses nothing either way).
    """

    def __init__(self, directory: Path, *, node: str, max_bytes: int, fsync: bool = True) -> None:
        if max_bytes <= 0:
            raise SpoolError(f"spool max bytes must be > 0, got {max_bytes}")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._fsync = fsync
        self._batches = self.directory / "batches"
        self._state_path = self.directory / "state.json"
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._entries: list[_Entry] = []
        self._pinned: int | None = None
        try:
            self._batches.mkdir(parents=True, exist_ok=True)
            probe = self.directory / ".write-probe"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise SpoolError(f"spool directory {self.directory} is not writable: {exc}") from exc
        self._state = self._load_state(node)
        self._load_entries()
        self._next_seq: int = max(
            int(self._state["seq_reserved"]), (self._entries[-1].seq + 1) if self._entries else 0
        )
        self._reserve_seq_block()

    # -- identity and counters -------------------------------------------------------------

    @property
    def agent_id(self) -> str:
        """This spool's agent identity (stable across restarts)."""
        return str(self._state["agent_id"])

    def _load_state(self, node: str) -> dict[str, Any]:
        fresh: dict[str, Any] = {
            # The server's identifiers are at most 128 characters.
            "agent_id": f"{node[:115]}-{uuid.uuid4().hex[:12]}",
            "seq_reserved": 0,
            "dropped": {"spool_full": 0, "rejected": 0},
            "dropped_participants": 0,
            "produced_samples": 0,
            "acked_samples": 0,
        }
        try:
            raw = self._state_path.read_bytes()
        except FileNotFoundError:
            return fresh
        try:
            state = orjson.loads(raw)
            if not isinstance(state, dict) or not isinstance(state.get("agent_id"), str):
                raise ValueError("no agent_id")
        except (orjson.JSONDecodeError, ValueError) as exc:
            # E.g. cut short by a power loss. A new identity is safe: the spooled batches keep the
            # agent_id and seq they were stored with, so the server still deduplicates them.
            aside = self._state_path.with_name("state.json.corrupt")
            os.replace(self._state_path, aside)
            log.error(
                "spool state %s is unreadable (%s); kept as %s, starting as agent %s",
                self._state_path,
                exc,
                aside,
                fresh["agent_id"],
            )
            return fresh
        for key, value in fresh.items():
            state.setdefault(key, value)
        return state

    def _save_state_locked(self, *, durable: bool = False) -> None:
        # Counters are replaced atomically but not fsynced (a power loss may lose their last
        # increments); a new seq reservation is fsynced, because reusing a seq loses data.
        replace_file(self._state_path, orjson.dumps(self._state), sync=self._fsync and durable)

    def _reserve_seq_block(self) -> None:
        with self._lock:
            self._state["seq_reserved"] = self._next_seq + _SEQ_BLOCK
            self._save_state_locked(durable=True)

    def _load_entries(self) -> None:
        for path in sorted(self._batches.iterdir()):
            name = path.name
            if name.startswith("."):
                path.unlink(missing_ok=True)  # a temporary file of a write that was cut short
                continue
            try:
                seq = int(name.removesuffix(".json"))
                body = orjson.loads(path.read_bytes())
                samples, low, participants = _count(body)
            except (ValueError, orjson.JSONDecodeError, KeyError, TypeError) as exc:
                # Cannot happen through the rename protocol; keep the evidence, do not replay it.
                log.error("spool file %s is unreadable (%s); moved aside", path, exc)
                path.rename(path.with_name(f"corrupt-{name}"))
                continue
            self._entries.append(_Entry(seq, path.stat().st_size, samples, low, participants))
        self._entries.sort(key=lambda e: e.seq)

    def _path(self, seq: int) -> Path:
        return self._batches / f"{seq:0{_NAME_DIGITS}d}.json"

    # -- producer side ---------------------------------------------------------------------

    def append(self, body: dict[str, Any]) -> int:
        """Give ``body`` the next ``seq``, store it durably, make room if over the limit.

        ``body`` must not contain ``seq``; returns the seq assigned. Raises :class:`SpoolError`
        when the disk refuses the write; the batch's samples are then counted as dropped
        (``spool_write_failed``).
        """
        samples, low, participants = _count(body)
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
            if self._next_seq >= self._state["seq_reserved"]:
                self._state["seq_reserved"] = self._next_seq + _SEQ_BLOCK
                self._save_state_locked(durable=True)
            body = {**body, "seq": seq}
            data = orjson.dumps(body)
            self._state["produced_samples"] += samples
            try:
                replace_file(self._path(seq), data, sync=self._fsync)
            except OSError as exc:
                # Disk full or gone: this round is lost, and counted as such.
                self._state["dropped"]["spool_write_failed"] = (
                    self._state["dropped"].get("spool_write_failed", 0) + samples
                )
                self._try_save_state_locked()
                raise SpoolError(f"cannot write batch seq={seq} to {self._batches}: {exc}") from exc
            self._entries.append(_Entry(seq, len(data), samples, low, participants))
            try:
                self._make_room_locked()
                self._save_state_locked()
            except OSError as exc:
                raise SpoolError(f"spool {self.directory} cannot be updated: {exc}") from exc
            finally:
                self._changed.notify_all()
        return seq

    def _try_save_state_locked(self) -> None:
        try:
            self._save_state_locked()
        except OSError as exc:
            log.error("spool state %s cannot be written: %s", self._state_path, exc)

    def _make_room_locked(self) -> None:
        total = sum(e.size for e in self._entries)
        # First pass: strip GPU/agent samples from the oldest batches.
        for entry in self._entries:
            if total <= self.max_bytes:
                return
            if entry.low_priority == 0 or entry.seq == self._pinned:
                continue
            path = self._path(entry.seq)
            body = orjson.loads(path.read_bytes())
            kept = [s for s in body["samples"] if is_job_signal(s["name"])]
            dropped = len(body["samples"]) - len(kept)
            body["samples"] = kept
            data = orjson.dumps(body)
            replace_file(path, data, sync=self._fsync)
            total -= entry.size - len(data)
            entry.size, entry.samples, entry.low_priority = len(data), len(kept), 0
            self._state["dropped"]["spool_full"] += dropped
        if any(e.low_priority for e in self._entries):
            # Only the batch being delivered still has GPU samples: go over the limit by that
            # one batch for the moment rather than drop job signals before GPU samples.
            return
        # Second pass: whole batches, oldest first (only job signals are left by now).
        for entry in list(self._entries):
            if total <= self.max_bytes:
                return
            if entry.seq == self._pinned:
                continue
            self._path(entry.seq).unlink(missing_ok=True)
            self._entries.remove(entry)
            total -= entry.size
            self._state["dropped"]["spool_full"] += entry.samples
            self._state["dropped_participants"] += entry.participants
        if total > self.max_bytes:
            log.warning(
                "spool over its limit (%d > %d bytes) with only the batch in flight left",
                total,
                self.max_bytes,
            )

    # -- consumer side ---------------------------------------------------------------------

    def wait_oldest(self, timeout: float) -> tuple[int, bytes] | None:
        """Pin and return the oldest batch (seq, body bytes), waiting up to ``timeout`` seconds."""
        with self._lock:
            if not self._entries:
                self._changed.wait(timeout)
            if not self._entries:
                return None
            entry = self._entries[0]
            self._pinned = entry.seq
            return entry.seq, self._path(entry.seq).read_bytes()

    def unpin(self) -> None:
        """Release the pinned batch (delivery failed; it stays for a retry)."""
        with self._lock:
            self._pinned = None

    def acknowledge(self, seq: int, *, rejected: bool = False) -> int:
        """Remove batch ``seq`` (delivered, or refused for good when ``rejected``); its samples."""
        with self._lock:
            self._pinned = None
            entry = next((e for e in self._entries if e.seq == seq), None)
            if entry is None:
                return 0
            self._entries.remove(entry)
            self._path(seq).unlink(missing_ok=True)
            if rejected:
                self._state["dropped"]["rejected"] += entry.samples
                self._state["dropped_participants"] += entry.participants
                self._save_state_locked()
            else:
                # Saved with the next append (once per round) or on close: one file replace less
                # per delivery; a kill -9 can cost the count of the last round's deliveries.
                self._state["acked_samples"] += entry.samples
            return entry.samples

    def close(self) -> None:
        """Write the counters (the batches themselves are always on disk already)."""
        with self._lock:
            self._try_save_state_locked()

    def stats(self) -> SpoolStats:
        """Depth, counters and totals, consistent with each other."""
        with self._lock:
            return SpoolStats(
                batches=len(self._entries),
                bytes=sum(e.size for e in self._entries),
                samples=sum(e.samples for e in self._entries),
                dropped=dict(self._state["dropped"]),
                produced_samples=int(self._state["produced_samples"]),
                acked_samples=int(self._state["acked_samples"]),
            )
