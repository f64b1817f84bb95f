"""recovery.tail.AppendedLines: the log follower the agent's state-log tail and the Ray
integration's verl log reader share."""

from __future__ import annotations

from pathlib import Path

from recovery.tail import AppendedLines


def test_missing_file_is_no_lines_and_a_partial_line_waits_for_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "log"
    lines = AppendedLines(path, max_read=1 << 20)
    assert lines.read() == ([], False)
    path.write_bytes(b"a\n\nb")
    assert lines.read() == ([b"a"], True)
    with path.open("ab") as f:
        f.write(b"c\nd\n")
    assert lines.read() == ([b"bc", b"d"], False)
    assert lines.read() == ([], False)


def test_look_back_drops_the_cut_line_and_a_shorter_file_is_read_from_its_start(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"first line\nsecond\n")
    lines = AppendedLines(path, max_read=1 << 20, look_back=10)
    assert lines.read() == ([b"second"], True)  # the line cut at the look-back point is dropped
    path.write_bytes(b"x\n")  # truncated: shorter than what was read
    assert lines.read() == ([b"x"], False)


def test_max_read_spreads_a_backlog_over_calls(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"aaaa\nbbbb\n")
    lines = AppendedLines(path, max_read=6)
    assert lines.read() == ([b"aaaa"], True)
    assert lines.read() == ([b"bbbb"], False)
