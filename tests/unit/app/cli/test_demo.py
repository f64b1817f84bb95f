from __future__ import annotations

from pathlib import Path

import pytest

from app.cli.demo import DEMO_DIR_MARKER, prepare_demo_dir


def test_new_and_previous_demo_dirs_are_prepared(tmp_path: Path) -> None:
    d = prepare_demo_dir(tmp_path / "demo")
    assert (d / DEMO_DIR_MARKER).exists()
    (d / "server.log").write_text("old run")
    again = prepare_demo_dir(d)
    assert sorted(p.name for p in again.iterdir()) == [DEMO_DIR_MARKER]


def test_a_foreign_non_empty_dir_is_refused_and_left_alone(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("precious")
    with pytest.raises(ValueError, match="not made by `rlguard demo`"):
        prepare_demo_dir(home)
    assert (home / "thesis.tex").read_text() == "precious"


def test_a_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        prepare_demo_dir(f)
    assert f.read_text() == "x"


def test_an_empty_dir_is_used(tmp_path: Path) -> None:
    d = tmp_path / "empty"
    d.mkdir()
    assert (prepare_demo_dir(d) / DEMO_DIR_MARKER).exists()
