"""``rlguard launch --py-spy``: the py-spy its hang-forensics dumps use; a bad path is refused
before anything starts, and the default is the one installed with RLGuard."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from integrations.launch import main as launch_main
from integrations.launch import plan
from recovery.supervision.stacks import find_py_spy
from tests.unit.integrations._launcher import SCRIPT

PY = sys.executable


@pytest.mark.parametrize("name", ["missing", "not-executable"])
def test_a_py_spy_that_cannot_run_is_refused_by_name(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / name
    if name == "not-executable":
        path.write_text("#!/bin/sh\n")
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        launch_main(
            [
                "--run-dir",
                str(run_dir),
                "--role",
                "trainer",
                "--py-spy",
                str(path),
                "--",
                PY,
                str(SCRIPT),
            ]
        )
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err == f"rlguard launch: error: --py-spy {str(path)!r} is not an executable file\n"
    assert not run_dir.exists()


def test_the_default_is_the_installed_py_spy_and_a_given_one_wins(tmp_path: Path) -> None:
    default = plan(["--run-dir", str(tmp_path / "a"), "--role", "trainer", "--", PY, str(SCRIPT)])
    assert default.py_spy == find_py_spy() and default.py_spy is not None
    wrapper = tmp_path / "py-spy-wrapper"
    wrapper.write_text('#!/bin/sh\nexec py-spy "$@"\n')
    wrapper.chmod(0o755)
    given = plan(
        [
            "--run-dir",
            str(tmp_path / "b"),
            "--role",
            "trainer",
            "--py-spy",
            str(wrapper),
            "--",
            PY,
            str(SCRIPT),
        ]
    )
    assert given.py_spy == str(wrapper)
