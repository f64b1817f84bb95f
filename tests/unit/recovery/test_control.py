"""The job's control file: atomic, revisioned commands."""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery.control import (
    CONTROL_FILE,
    ControlError,
    ControlMode,
    read_control,
    write_control,
)

pytestmark = pytest.mark.timeout(30)


def test_missing_file_means_run_at_revision_zero(tmp_path: Path) -> None:
    state = read_control(tmp_path)
    assert (state.mode, state.revision, state.reason) == (ControlMode.RUN, 0, "")


def test_writes_bump_the_revision(tmp_path: Path) -> None:
    first = write_control(tmp_path, ControlMode.SAFE_MODE, "several nodes lost")
    second = write_control(tmp_path, "run", "approved by alice")
    assert (first.revision, second.revision) == (1, 2)
    assert read_control(tmp_path) == second
    # No temporary file is left beside the command (only the file and its writers' lock).
    assert sorted(p.name for p in tmp_path.iterdir()) == [CONTROL_FILE, CONTROL_FILE + ".lock"]


@pytest.mark.parametrize(
    ("mode", "reason", "message"),
    [
        ("pause", "x", "unknown control mode 'pause'"),
        ("run", "", "reason must be a non-empty string"),
        ("run", None, "reason must be a non-empty string"),
        ("run", "x" * 3000, "more than 2000"),
    ],
)
def test_bad_input_writes_nothing(tmp_path: Path, mode: str, reason: object, message: str) -> None:
    write_control(tmp_path, "safe_mode", "before")
    before = (tmp_path / CONTROL_FILE).read_bytes()
    with pytest.raises(ControlError, match=message):
        write_control(tmp_path, mode, reason)  # type: ignore[arg-type]
    assert (tmp_path / CONTROL_FILE).read_bytes() == before


def test_missing_run_dir(tmp_path: Path) -> None:
    with pytest.raises(ControlError, match="does not exist"):
        write_control(tmp_path / "nope", "run", "x")


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b'{"mode": "dance", "reason": "", "revision": 1, "updated_at": 1}',
        b'{"mode": "run"}',
        b'{"mode": "run", "reason": "", "revision": 0, "updated_at": 1}',
    ],
)
def test_damaged_control_file_is_an_error(tmp_path: Path, content: bytes) -> None:
    (tmp_path / CONTROL_FILE).write_bytes(content)
    with pytest.raises(ControlError, match="not a valid control file"):
        read_control(tmp_path)
