from __future__ import annotations

import pytest
from typer.testing import CliRunner

from app.cli import cli


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["up"],
        ["server"],
        ["db"],
        ["db", "upgrade"],
        ["db", "downgrade"],
        ["db", "current"],
        ["token"],
        ["token", "create"],
        ["token", "revoke"],
        ["token", "list"],
        ["user"],
        ["user", "create"],
        ["user", "disable"],
        ["user", "enable"],
        ["user", "set-password"],
        ["user", "delete"],
        ["breaker"],
        ["breaker", "list"],
        ["breaker", "reset"],
    ],
)
def test_help_on_every_command(args: list[str]) -> None:
    result = CliRunner().invoke(cli, [*args, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def test_user_create_needs_a_role() -> None:
    result = CliRunner().invoke(cli, ["user", "create", "bob"])
    assert result.exit_code == 2
    assert "--role" in result.output
