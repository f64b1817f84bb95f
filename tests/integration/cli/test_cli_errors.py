"""CLI error handling, in-process (same code path as the `rlguard` script, minus the start-up
cost): bad values end in one `rlguard: error:` line on stderr, exit 2, and change nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from app.cli import cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def env(sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    for k in list(os.environ):
        if k.startswith("RLGUARD_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("RLGUARD_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("RLGUARD_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("RLGUARD_DEV", "1")
    return sqlite_url


def invoke(*args: str, stdin: str | None = None):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, list(args), input=stdin)


def one_error_line(result, code: int = 2) -> str:  # type: ignore[no-untyped-def]
    assert result.exit_code == code, (result.exit_code, result.output)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlguard: error: "), result.stderr
    return lines[0]


BAD_VALUES = [
    (["user", "create", "bob", "--role", "boss"], None, "invalid role 'boss'"),
    (["user", "create", "bad name", "--role", "viewer"], None, "invalid user name 'bad name'"),
    (
        ["user", "create", "bob", "--role", "viewer", "--password-stdin"],
        "short\n",
        "shorter than 8",
    ),
    (["user", "create", "bob", "--role", "viewer", "--password-stdin"], "", "stdin was empty"),
    (["user", "create", "bob", "--role", "viewer"], None, "user 'bob' already exists"),
    (["token", "create", "--node", "bad node"], None, "invalid node name 'bad node'"),
    (["token", "create", "--node", ""], None, "invalid node name ''"),
    (["token", "create", "--node", "-rf"], None, "invalid node name '-rf'"),
    (["token", "revoke", "999"], None, "no token with id 999"),
    (["token", "revoke", str(2**63)], None, f"invalid token id {2**63}"),
    (["token", "rotate", "0"], None, "invalid token id 0"),
    (["db", "upgrade", "--revision", "nope"], None, "revision 'nope'"),
    (["server", "--port", "70000"], None, "--port 70000"),
    (["up", "--port", "0"], None, "--port 0"),
]


def test_bad_values_give_one_line_errors_and_change_nothing(env: str) -> None:
    assert invoke("db", "upgrade").exit_code == 0
    assert invoke("user", "create", "bob", "--role", "viewer").exit_code == 0
    engine = sa.create_engine(env)

    def counts() -> tuple[int, ...]:
        with engine.connect() as conn:
            return tuple(
                conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one()
                for t in ("user_account", "api_token", "node", "audit_event")
            )

    before = counts()
    for args, stdin, needle in BAD_VALUES:
        line = one_error_line(invoke(*args, stdin=stdin))
        assert needle in line, (args, line)
    assert counts() == before
    engine.dispose()


def test_unmigrated_unreachable_and_misconfigured(
    env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = one_error_line(invoke("user", "create", "bob", "--role", "viewer"), code=1)
    assert "rlguard db upgrade" in line
    monkeypatch.setenv("RLGUARD_DATABASE_URL", "postgresql+psycopg://postgres:pw@127.0.0.1:1/none")
    line = one_error_line(invoke("token", "create", "--node", "n1"), code=1)
    assert line.startswith(
        "rlguard: error: database postgresql+psycopg://postgres:***@127.0.0.1:1/none"
    )
    assert ":pw@" not in line
    line = one_error_line(invoke("db", "upgrade"), code=1)
    assert "127.0.0.1:1" in line
    monkeypatch.setenv("RLGUARD_PORT", "http")
    line = one_error_line(invoke("token", "list"))
    assert "RLGUARD_PORT" in line and "'http'" in line
    monkeypatch.delenv("RLGUARD_PORT")
    monkeypatch.setenv("RLGUARD_DATABASE_URL", f"sqlite:///{tmp_path / 'x.db'}")
    monkeypatch.setenv("RLGUARD_DATA_DIR", "/proc/forbidden/data")
    line = one_error_line(invoke("up"))
    assert "RLGUARD_DATA_DIR /proc/forbidden/data" in line


def test_token_list_and_revoke(env: str) -> None:
    assert invoke("db", "upgrade").exit_code == 0
    created = invoke("token", "create", "--node", "gpu-01")
    token = created.stdout.strip()
    listed = invoke("token", "list")
    assert listed.exit_code == 0
    assert (
        "node:gpu-01" in listed.stdout and token not in listed.stdout and "active" in listed.stdout
    )
    token_id = listed.stdout.split("\t", 1)[0]
    revoked = invoke("token", "revoke", token_id)
    assert revoked.exit_code == 0 and revoked.stdout == ""
    assert "revoked" in invoke("token", "list").stdout
