"""Bad values of the serving options end in one line naming them, and change nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import cli


@pytest.mark.parametrize("command", ["server", "up"])
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--header-timeout", "0"], "--header-timeout 0.0 must be above 0 and at most 300 seconds"),
        (["--header-timeout", "301"], "--header-timeout 301.0 must be above 0"),
        (["--header-timeout", "nan"], "--header-timeout nan must be above 0"),
        (["--limit-concurrency", "0"], "--limit-concurrency 0 must be at least 1"),
        (["--port", "70000"], "--port 70000 is not a TCP port (1-65535)"),
    ],
)
def test_bad_serving_options_are_named_and_change_nothing(
    command: str, args: list[str], needle: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    monkeypatch.setenv("RLGUARD_DATA_DIR", str(data))
    before = {k: v for k, v in os.environ.items() if k.startswith("RLGUARD_")}
    r = CliRunner().invoke(cli, [command, *args])
    assert r.exit_code == 2, r.output
    assert f"rlguard: error: {needle}" in r.output
    assert not data.exists()
    assert {k: v for k, v in os.environ.items() if k.startswith("RLGUARD_")} == before
