"""`rlguard user disable|enable|set-password|delete` (issue 17 item 2) on a migrated SQLite
database, through the real command parser; bad values end in one line naming them and change
nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from app.cli import cli
from app.core import migrate
from app.core.db import make_engine

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


class Cli:
    def __init__(self, tmp_path: Path) -> None:
        self.url = f"sqlite:///{tmp_path / 'rlguard.db'}"
        migrate.upgrade(self.url)
        self.env = {"RLGUARD_DATABASE_URL": self.url, "RLGUARD_DATA_DIR": str(tmp_path)}

    def __call__(self, *args: str, stdin: str | None = None) -> tuple[int, str]:
        result = CliRunner().invoke(cli, list(args), input=stdin, env=self.env)
        return result.exit_code, result.output

    def users(self) -> dict[str, tuple[bool, str | None]]:
        engine = make_engine(self.url)
        try:
            with engine.connect() as conn:
                rows = conn.execute(
                    sa.text("SELECT name, disabled, password_hash FROM user_account")
                )
                return {r[0]: (bool(r[1]), r[2]) for r in rows}
        finally:
            engine.dispose()

    def audit(self) -> list[tuple[str, str, str]]:
        engine = make_engine(self.url)
        try:
            with engine.connect() as conn:
                rows = conn.execute(
                    sa.text(
                        "SELECT actor, action, target FROM audit_event WHERE action LIKE "
                        "'user.%' AND action != 'user.create' ORDER BY id"
                    )
                )
                return [tuple(r) for r in rows]  # type: ignore[misc]
        finally:
            engine.dispose()


def test_user_lifecycle_from_the_cli(tmp_path: Path) -> None:
    run = Cli(tmp_path)
    assert run("user", "create", "root", "--role", "admin")[0] == 0
    assert run("user", "create", "vic", "--role", "viewer")[0] == 0

    code, out = run("user", "disable", "vic")
    assert code == 0 and "user 'vic' disabled" in out
    assert run.users()["vic"][0] is True
    assert run("user", "enable", "vic")[0] == 0 and run.users()["vic"][0] is False
    code, _ = run("user", "set-password", "vic", "--password-stdin", stdin="a long password\n")
    assert code == 0 and run.users()["vic"][1] is not None
    assert run("user", "delete", "vic")[0] == 0 and "vic" not in run.users()
    assert run.audit() == [
        ("cli", "user.disable", "user:vic"),
        ("cli", "user.enable", "user:vic"),
        ("cli", "user.set_password", "user:vic"),
        ("cli", "user.delete", "user:vic"),
    ]


def test_bad_values_are_named_and_change_nothing(tmp_path: Path) -> None:
    run = Cli(tmp_path)
    assert run("user", "create", "root", "--role", "admin")[0] == 0
    before = run.users()
    cases = [
        (("user", "disable", "ghost"), None, "no user named 'ghost'"),
        (("user", "enable", "ghost"), None, "no user named 'ghost'"),
        (("user", "delete", "ghost"), None, "no user named 'ghost'"),
        (("user", "delete", "root"), None, "last enabled admin"),
        (("user", "disable", "root"), None, "last enabled admin"),
        (("user", "set-password", "root"), None, "--password-stdin"),
        (("user", "set-password", "root", "--password-stdin"), "\n", "stdin was empty"),
        (("user", "set-password", "root", "--password-stdin"), "short\n", "shorter than 8"),
        (("user", "set-password", "ghost", "--password-stdin"), "long enough pw\n", "'ghost'"),
    ]
    for args, stdin, reason in cases:
        code, out = run(*args, stdin=stdin)
        assert code == 2, (args, code, out)
        assert out.strip().startswith("rlguard: error:") and reason in out, (args, out)
    assert run.users() == before and run.audit() == []
