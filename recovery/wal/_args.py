"""Checking the arguments of the WAL's write calls, before anything is written.

Every write call (``append``, ``append_many``, ``update_status``, ``update_many``) first turns
its arguments into checked values here, so that a bad value raises :class:`WALError` naming
it while nothing, not even a data file, has been written yet.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from recovery.wal._errors import WALError
from recovery.wal._format import MAX_PAYLOAD_BYTES, encode_record
from recovery.wal._index import (
    NewEntry,
    StatusChange,
    StepType,
    WALStatus,
    check_entry_id,
    parse_status,
    parse_step_type,
)


class NewChecked(NamedTuple):
    """An entry to append whose arguments passed the checks."""

    eid: str
    step: StepType
    data: bytes | bytearray | memoryview | None
    external: Path | None


class ChangeChecked(NamedTuple):
    """A status change whose arguments passed the checks (the entry is checked later, under
    the append lock)."""

    eid: str
    status: WALStatus
    error: str | None


def check_new(
    entry_id: object,
    step_type: object,
    data: object = None,
    data_path: object = None,
) -> NewChecked:
    """The arguments of one append, checked."""
    eid = check_entry_id(entry_id)
    step = parse_step_type(step_type)
    if data is not None and data_path is not None:
        raise WALError(f"entry {eid!r}: pass data or data_path, not both")
    if data is not None and not isinstance(data, bytes | bytearray | memoryview):
        raise WALError(f"entry {eid!r}: data must be bytes, got {type(data).__name__}")
    external: Path | None = None
    if data_path is not None:
        if not isinstance(data_path, str | os.PathLike):
            raise WALError(f"entry {eid!r}: data_path must be a path, got {data_path!r}")
        external = Path(data_path)
        if not external.is_file():
            raise WALError(f"entry {eid!r}: data_path {str(external)!r} is not an existing file")
    return NewChecked(eid, step, data, external)


def check_change(entry_id: object, status: object, error: object = None) -> ChangeChecked:
    """The arguments of one status change, checked."""
    eid = check_entry_id(entry_id)
    new_status = parse_status(status)
    if error is not None:
        if not isinstance(error, str):
            raise WALError(f"error must be a string, got {type(error).__name__}")
        if new_status is not WALStatus.FAILED:
            raise WALError(
                f"entry {eid!r}: an error message goes only with FAILED, not {new_status}"
            )
    return ChangeChecked(eid, new_status, error)


def item_list(values: object, method: str, what: str) -> list[object]:
    """The items of a batch call's argument as a list; a string, a mapping or something that
    is not iterable is refused by name (a string would otherwise be taken character by
    character)."""
    if isinstance(values, str | bytes | dict):
        raise WALError(f"{method} takes a list of {what}, got {type(values).__name__}")
    if not isinstance(values, Iterable):
        raise WALError(f"{method} takes a list of {what}, got {values!r}")
    return list(values)


def new_entry_fields(item: object, position: int) -> tuple[object, object, object, object]:
    """(entry_id, step_type, data, data_path) of an ``append_many`` item: a
    :class:`NewEntry` or an ``(entry_id, step_type)`` pair."""
    if isinstance(item, NewEntry):
        return item.entry_id, item.step_type, item.data, item.data_path
    if isinstance(item, tuple) and len(item) == 2:
        return item[0], item[1], None, None
    raise WALError(
        f"append_many item {position} is {item!r}; expected a NewEntry or an "
        "(entry_id, step_type) pair"
    )


def change_fields(item: object, position: int) -> tuple[object, object, object]:
    """(entry_id, status, error) of an ``update_many`` item: a :class:`StatusChange` or an
    ``(entry_id, status)`` pair."""
    if isinstance(item, StatusChange):
        return item.entry_id, item.status, item.error
    if isinstance(item, tuple) and len(item) == 2:
        return item[0], item[1], None
    raise WALError(
        f"update_many item {position} is {item!r}; expected a StatusChange or an "
        "(entry_id, status) pair"
    )


def encode_changes(payloads: list[dict[str, Any]]) -> bytes:
    """One record for the changes of one call: a plain record for one change, a group record
    (kind ``m``, all or nothing after a crash) for several."""
    try:
        if len(payloads) == 1:
            return encode_record(payloads[0])
        return encode_record({"k": "m", "r": payloads})
    except ValueError:
        raise WALError(
            f"{len(payloads)} changes do not fit one WAL record of at most {MAX_PAYLOAD_BYTES} "
            "bytes; split them over several calls"
        ) from None
