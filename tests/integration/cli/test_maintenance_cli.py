"""``rlguard maintenance add|list|expire`` as a user runs it (subprocesses)."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from app.core import migrate
from tests.harness import rlguard_env, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(180)]


def test_add_list_and_expire_one_off_and_weekly_windows(database_url: str, tmp_path: Path) -> None:
    migrate.upgrade(database_url)
    env = rlguard_env(database_url, tmp_path / "data")
    once = run_cli("maintenance", "add", "--node", "n1", "--duration", "2h",
                   "--comment", "driver update", env=env)  # fmt: skip
    assert once.returncode == 0, once.stderr
    weekly = run_cli("maintenance", "add", "--job", "grpo-a", "--weekly", "sun", "--at", "23:00",
                     "--duration", "3h", "--comment", "cluster upgrade", env=env)  # fmt: skip
    assert weekly.returncode == 0, weekly.stderr
    wid, oid = int(weekly.stdout), int(once.stdout)
    lines = run_cli("maintenance", "list", env=env).stdout.splitlines()
    assert [line.split("\t")[0] for line in lines] == [str(wid), str(oid)]  # newest first
    w, o = (line.split("\t") for line in lines)
    assert (w[2], w[3], w[4], w[5]) == (
        "job=grpo-a", "every sun 23:00 UTC for 180m", "cli", "cluster upgrade"
    )  # fmt: skip
    assert (o[1], o[2], o[4], o[5]) == ("open", "node=n1", "cli", "driver update")
    assert run_cli("maintenance", "expire", str(oid), env=env).returncode == 0
    assert [x.split("\t")[0] for x in run_cli("maintenance", "list", env=env).stdout.splitlines()] == [
        str(wid)
    ]  # fmt: skip
    listed_all = run_cli("maintenance", "list", "--all", env=env).stdout.splitlines()
    assert listed_all[1].split("\t")[1] == "expired"
    again = run_cli("maintenance", "expire", str(oid), env=env)
    assert again.returncode == 2 and "already expired" in again.stderr, again.stderr
    with sa.create_engine(database_url).connect() as conn:
        actions = [r[0] for r in conn.execute(sa.text("SELECT action FROM audit_event"))]
    assert actions == [
        "maintenance_window.create", "maintenance_window.create", "maintenance_window.expire"
    ]  # fmt: skip


def test_bad_values_are_named_and_nothing_is_stored(sqlite_url: str, tmp_path: Path) -> None:
    """The checks run before the database is touched: SQLite alone shows them (each
    ``rlguard`` start costs seconds; the add/list/expire test runs on both databases)."""
    migrate.upgrade(sqlite_url)
    env = rlguard_env(sqlite_url, tmp_path / "data")
    for args, named in [
        (["--duration", "1h"], "names a node or a job"),
        (["--node", "n1", "--duration", "two hours"], "--duration 'two hours'"),
        (["--node", "n1", "--duration", "30d"], "longer than the maximum"),
        (["--node", "n1", "--duration", "1h", "--ends", "2030-01-01T00:00:00Z"], "not both"),
        (["--node", "n1", "--ends", "2030-01-01T00:00:00"], "--ends '2030-01-01T00:00:00'"),
        (
            ["--node", "n1", "--weekly", "someday", "--at", "01:00", "--duration", "1h"],
            "--weekly 'someday'",
        ),
        (["--node", "n1", "--weekly", "mon", "--duration", "1h"], "needs --at"),
        (["--node", "n1", "--weekly", "mon", "--at", "25:00", "--duration", "1h"], "'25:00'"),
        (["--node", "n1", "--at", "01:00", "--duration", "1h"], "--at '01:00' is for a weekly"),
    ]:
        bad = run_cli("maintenance", "add", *args, "--comment", "x", env=env)
        assert bad.returncode == 2, (args, bad.stderr)
        assert named in bad.stderr and bad.stderr.startswith("rlguard: error: "), bad.stderr
    with sa.create_engine(sqlite_url).connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM maintenance_window")).scalar_one() == 0
        assert conn.execute(sa.text("SELECT count(*) FROM audit_event")).scalar_one() == 0
