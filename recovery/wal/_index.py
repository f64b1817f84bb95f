"""The WAL's public value types and the in-memory index rebuilt from its records.

Records come in four kinds: ``a`` (an entry was appended, or, after compaction, its full
current state), ``s`` (a status change), ``m`` (several ``a`` or ``s`` changes written by one
call, which survive a crash together or not at all) and ``base`` (the first record of a
compacted segment).
The index maps each entry id to its latest state; Python dicts keep insertion order, which is
append order, and ``recover()`` relies on that.

Every process that has the log open applies every record any process writes (to refuse a
duplicate id or a change out of COMPLETED), so applying one is kept cheap: a decoded record is
stored as a plain tuple, and turned into a :class:`WALEntry` only when somebody asks for it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from recovery.wal._errors import WALError

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


@dataclass(frozen=True, slots=True)
class NewEntry:
    """One entry for :meth:`~recovery.wal.WriteAheadLog.append_many`: the arguments of one
    ``append`` call."""

    entry_id: str
    step_type: StepType | str
    data: bytes | None = None
    data_path: str | os.PathLike[str] | None = None


@dataclass(frozen=True, slots=True)
class StatusChange:
    """One change for :meth:`~recovery.wal.WriteAheadLog.update_many`: the arguments of one
    ``update_status`` call."""

    entry_id: str
    status: WALStatus | str
    error: str | None = None


# Plain dict lookups: calling the enum class costs several times more, on every write call.
_STEP_TYPES = {s.value: s for s in StepType}
_STATUSES = {s.value: s for s in WALStatus}


def parse_status(value: object) -> WALStatus:
    """``value`` as a :class:`WALStatus`, or a :class:`WALError` naming it."""
    if isinstance(value, str) and (status := _STATUSES.get(value)) is not None:
        return status
    allowed = ", ".join(s.value for s in WALStatus)
    raise WALError(f"unknown WAL status {value!r}; expected one of {allowed}")


def parse_step_type(value: object) -> StepType:
    """``value`` as a :class:`StepType`, or a :class:`WALError` naming it."""
    if isinstance(value, str) and (step := _STEP_TYPES.get(value)) is not None:
        return step
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


# What the index holds for an entry that nobody has asked for yet: the fields of its WALEntry
# after entry_id, in order (step_type, status, data_path, checksum, created_at, updated_at,
# error).
_Row = tuple[StepType, WALStatus, Path | None, str | None, float, float, str | None]


class EntryIndex:
    """Latest state per entry id, in append order, built by applying records in log order."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._entries: dict[str, WALEntry | _Row] = {}

    def clear(self) -> None:
        """Forget everything (before a rescan from the first segment)."""
        self._entries = {}

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self._entries

    def get(self, entry_id: str) -> WALEntry | None:
        """The latest state of ``entry_id``, or None."""
        value = self._entries.get(entry_id)
        if value is None or isinstance(value, WALEntry):
            return value
        entry = WALEntry(entry_id, *value)
        self._entries[entry_id] = entry  # same key: the order does not change
        return entry

    def all(self) -> list[WALEntry]:
        """Every entry, in append order."""
        entries = self._entries
        for entry_id, value in entries.items():
            if not isinstance(value, WALEntry):
                entries[entry_id] = WALEntry(entry_id, *value)
        return list(entries.values())  # type: ignore[arg-type]  # all WALEntry by now

    def put(self, entry: WALEntry) -> None:
        """Record ``entry`` as its id's latest state (after this process wrote its record)."""
        self._entries[entry.entry_id] = entry

    def apply(self, payload: dict[str, Any]) -> None:
        """Apply one decoded record; raises KeyError/TypeError/ValueError/WALError if it is
        not a valid change of this log (the caller reports that as corruption)."""
        kind = payload["k"]
        if kind == "base":
            return
        if kind == "m":
            changes = payload["r"]
            if not isinstance(changes, list) or not changes:
                raise TypeError(f"changes of a group record {changes!r}")
            for change in changes:
                if not isinstance(change, dict) or change.get("k") not in ("a", "s"):
                    raise ValueError(f"a group record holds {change!r}, not a change")
                self.apply(change)
            return
        eid = payload["id"]
        if not isinstance(eid, str):
            raise TypeError(f"entry id {eid!r}")
        if kind == "a":
            ts = float(payload["ts"])
            stored = payload.get("p")
            self._entries[eid] = (
                _STEP_TYPES[payload["t"]],
                _STATUSES[payload["s"]],
                None if stored is None else self.resolve(stored),
                payload.get("c"),
                float(payload.get("cts", ts)),
                ts,
                payload.get("e"),
            )
        elif kind == "s":
            current = self._entries.get(eid)
            if current is None:
                raise WALError(f"status change for entry {eid!r} that was never appended")
            if isinstance(current, WALEntry):
                step, data_path, checksum, created = (
                    current.step_type,
                    current.data_path,
                    current.checksum,
                    current.created_at,
                )
            else:
                step, _, data_path, checksum, created, _, _ = current
            self._entries[eid] = (
                step,
                _STATUSES[payload["s"]],
                data_path,
                checksum,
                created,
                float(payload["ts"]),
                payload.get("e"),
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
