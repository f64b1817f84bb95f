"""The WAL's public value types and the in-memory index rebuilt from its records.

Records come in three kinds: ``a`` (an entry was appended, or, after compaction, its full
current state), ``s`` (a status change) and ``base`` (the first record of a compacted segment).
The index maps each entry id to its latest state; Python dicts keep insertion order, which is
append order, and ``recover()`` relies on that.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from recovery._wal_errors import WALError

MAX_ENTRY_ID_CHARS = 512


class WALStatus(StrEnum):
    """Lifecycle of a logged step."""

    PENDING = "pending"
    EXECUTING = "executing"
    COMPLETED = "completed"
    FAILED = "failed"


class StepType(StrEnum):
    """The kind of rollout step an entry stands for."""

    GENERATE = "generate"
    REWARD = "reward"
    UPDATE = "update"


@dataclass(frozen=True)
class WALEntry:
    """The latest known state of one logged step."""

    entry_id: str
    step_type: StepType
    status: WALStatus
    data_path: Path | None
    checksum: str | None
    created_at: float
    updated_at: float
    error: str | None = None


def parse_status(value: object) -> WALStatus:
    """``value`` as a :class:`WALStatus`, or a :class:`WALError` naming it."""
    if isinstance(value, str):
        try:
            return WALStatus(value)
        except ValueError:
            pass
    allowed = ", ".join(s.value for s in WALStatus)
    raise WALError(f"unknown WAL status {value!r}; expected one of {allowed}")


def parse_step_type(value: object) -> StepType:
    """``value`` as a :class:`StepType`, or a :class:`WALError` naming it."""
    if isinstance(value, str):
        try:
            return StepType(value)
        except ValueError:
            pass
    allowed = ", ".join(s.value for s in StepType)
    raise WALError(f"unknown step type {value!r}; expected one of {allowed}")


def check_entry_id(entry_id: object) -> str:
    """``entry_id`` if it is a non-blank string of sane length, else a :class:`WALError`."""
    if not isinstance(entry_id, str):
        raise WALError(f"entry_id must be a string, got {type(entry_id).__name__} {entry_id!r}")
    if not entry_id.strip():
        raise WALError(f"entry_id must not be empty or blank, got {entry_id!r}")
    if len(entry_id) > MAX_ENTRY_ID_CHARS:
        raise WALError(f"entry_id is {len(entry_id)} characters, more than {MAX_ENTRY_ID_CHARS}")
    return entry_id


class EntryIndex:
    """Latest state per entry id, in append order, built by applying records in log order."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.entries: dict[str, WALEntry] = {}

    def clear(self) -> None:
        """Forget everything (before a rescan from the first segment)."""
        self.entries = {}

    def apply(self, payload: dict[str, Any]) -> None:
        """Apply one decoded record; raises KeyError/TypeError/ValueError/WALError if it is
        not a valid change of this log (the caller reports that as corruption)."""
        kind = payload["k"]
        if kind == "base":
            return
        eid = payload["id"]
        if not isinstance(eid, str):
            raise TypeError(f"entry id {eid!r}")
        if kind == "a":
            self.entries[eid] = WALEntry(
                entry_id=eid,
                step_type=StepType(payload["t"]),
                status=WALStatus(payload["s"]),
                data_path=self.resolve(payload.get("p")),
                checksum=payload.get("c"),
                created_at=float(payload.get("cts", payload["ts"])),
                updated_at=float(payload["ts"]),
                error=payload.get("e"),
            )
        elif kind == "s":
            current = self.entries.get(eid)
            if current is None:
                raise WALError(f"status change for entry {eid!r} that was never appended")
            self.entries[eid] = replace(
                current,
                status=WALStatus(payload["s"]),
                updated_at=float(payload["ts"]),
                error=payload.get("e"),
            )
        else:
            raise ValueError(f"unknown record kind {kind!r}")

    def snapshot_payload(self, entry: WALEntry) -> dict[str, Any]:
        """An ``a`` record that recreates ``entry`` as it is now (used by compaction)."""
        return {
            "k": "a",
            "id": entry.entry_id,
            "t": entry.step_type.value,
            "s": entry.status.value,
            "cts": entry.created_at,
            "ts": entry.updated_at,
            "p": self.stored_path(entry.data_path),
            "c": entry.checksum,
            "e": entry.error,
        }

    def stored_path(self, path: Path | None) -> str | None:
        """How a data path is written in a record: relative inside the log directory."""
        if path is None:
            return None
        try:
            return path.relative_to(self.directory).as_posix()
        except ValueError:
            return str(path)

    def resolve(self, stored: object) -> Path | None:
        """The absolute path a record's stored data path stands for."""
        if stored is None:
            return None
        if not isinstance(stored, str):
            raise TypeError(f"data path {stored!r}")
        path = Path(stored)
        return path if path.is_absolute() else self.directory / path
