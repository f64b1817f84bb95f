"""The rlguard CLI as a user runs it (subprocesses), on SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from app.core import migrate
from tests.harness import RLGUARD, ServerProcess, auth, rlguard_env, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_tokens_and_users_against_the_configured_database(
    database_url: str, tmp_path: Path
) -> None:
    env = rlguard_env(database_url, tmp_path / "data")
    r = run_cli("db", "upgrade", env=env)
    assert r.returncode == 0, r.stderr
    assert run_cli("db", "current", env=env).stdout.strip() == migrate.head_revision(database_url)

    r = run_cli("token", "create", "--node", "gpu-01", env=env)
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    assert r.stdout == token + "\n" and token.startswith("rlgn_") and len(token) > 40
    r = run_cli(
        "user",
        "create",
        "ada",
        "--role",
        "operator",
        "--password-stdin",
        env=env,
        stdin="long-password\n",
    )
    assert r.returncode == 0, r.stderr
    user_token = r.stdout.strip()
    assert r.stdout == user_token + "\n" and user_token.startswith("rlgu_")

    engine = sa.create_engine(database_url)
    with engine.connect() as conn:
        hashes = {row[0] for row in conn.execute(sa.text("SELECT token_hash FROM api_token"))}
        pw_hash = conn.execute(
            sa.text("SELECT password_hash FROM user_account WHERE name='ada'")
        ).scalar()
        actions = [
            row[0] for row in conn.execute(sa.text("SELECT action FROM audit_event ORDER BY id"))
        ]
    engine.dispose()
    # only hashes are stored, never the tokens or the password
    assert hashlib.sha256(token.encode()).hexdigest() in hashes
    assert token not in hashes and user_token not in hashes
    assert pw_hash.startswith("$argon2") and "long-password" not in pw_hash
    assert actions == ["node.register", "token.create", "user.create", "token.create"]
    # token list / revoke: tests/integration/cli/test_cli_errors.py


def test_the_script_itself_reports_bad_values_in_one_line(sqlite_url: str, tmp_path: Path) -> None:
    """Through the installed script (main()'s guard included): a bad setting that the worker
    extension reads at import time, and a bad argument. (All cases: test_cli_errors.)"""
    bad_env = rlguard_env(sqlite_url, tmp_path / "data", RLGUARD_PORT="http")
    r = run_cli("token", "list", env=bad_env)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.startswith("rlguard: error: RLGUARD_PORT") and "'http'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = run_cli(
        "user", "create", "bob", "--role", "boss", env=rlguard_env(sqlite_url, tmp_path / "data")
    )
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.strip() == (
        "rlguard: error: invalid role 'boss': choose one of viewer, operator, approver, admin"
    )


def test_server_refuses_the_default_secret_and_an_unmigrated_database(
    sqlite_url: str, tmp_path: Path, server_factory: Callable[..., ServerProcess]
) -> None:
    env = rlguard_env(sqlite_url, tmp_path / "data")
    server = server_factory("server", env).start(wait_ready=False)
    assert server.proc is not None and server.proc.wait(30) == 2
    assert "RLGUARD_SECRET_KEY is the built-in default" in server.output()
    env_secret = {**env, "RLGUARD_SECRET_KEY": "x" * 32}
    server = server_factory("server", env_secret).start(wait_ready=False)
    assert server.proc is not None and server.proc.wait(30) == 1
    assert "rlguard db upgrade" in server.output()
    # a migrated database with a real secret serves: tests/integration/crash/test_ingest_restart.py


def test_up_on_a_fresh_data_dir(
    tmp_path: Path, server_factory: Callable[..., ServerProcess]
) -> None:
    data = tmp_path / "fresh" / "rlguard-data"
    env = rlguard_env(None, data)
    server = server_factory("up", env).start(timeout=60)
    assert httpx.get(server.url + "/readyz").json()["database"] == "ok"
    log = server.output()
    assert "created the first admin user 'admin'" in log
    creds = data / "initial-admin-credentials.txt"
    assert str(creds) in log
    secret = data / "secret_key"
    for f in (creds, secret):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    fields = dict(
        line.split(": ", 1) for line in creds.read_text().splitlines() if not line.startswith("#")
    )
    assert fields["password"] not in log and fields["api_token"] not in log  # never on the console
    assert (data / "rlguard.db").exists()
    me = httpx.get(server.url + "/api/v1/me", headers=auth(fields["api_token"])).json()
    assert me == {**me, "name": "admin", "role": "admin"}
    login = httpx.post(
        server.url + "/api/v1/auth/token", json={"name": "admin", "password": fields["password"]}
    )
    assert login.status_code == 201
    kept = secret.read_text()
    server.stop()

    # second start: same secret, no second admin, credentials file untouched
    before = creds.read_text()
    server2 = server_factory("up", env).start(timeout=60)
    assert secret.read_text() == kept
    assert creds.read_text() == before
    assert "created the first admin" not in server2.output().split("RLGuard at")[-1]
    server2.stop()


def test_agent_passes_every_argument_through(tmp_path: Path) -> None:
    """`rlguard agent ARGS` execs `python -m agents ARGS` (the agent package is another team's)."""
    fake = tmp_path / "shim"
    (fake / "agents").mkdir(parents=True)
    (fake / "agents" / "__init__.py").write_text("")
    (fake / "agents" / "__main__.py").write_text("import sys; print('ARGS', sys.argv[1:])\n")
    env = {**os.environ, "PYTHONPATH": str(fake)}
    out = subprocess.run(
        [*RLGUARD, "agent", "--server", "http://x", "--help", "-v"],
        env=env,
        cwd=fake,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "ARGS ['--server', 'http://x', '--help', '-v']" in out.stdout
