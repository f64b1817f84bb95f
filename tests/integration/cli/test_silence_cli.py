"""``rlguard silence add|list|expire`` as a user runs it (subprocesses)."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from app.core import migrate
from tests.harness import rlguard_env, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(180)]


def test_add_list_expire_and_bad_values_named(database_url: str, tmp_path: Path) -> None:
    migrate.upgrade(database_url)
    env = rlguard_env(database_url, tmp_path / "data")
    r = run_cli("silence", "add", "node=n1", "kind=~gpu_.*", "--duration", "2h",
                "--comment", "riser swap", "--stop-actions", env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    sid = int(r.stdout.strip())
    listed = run_cli("silence", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    [line] = listed.stdout.splitlines()
    fields = line.split("\t")
    assert (fields[0], fields[1], fields[4], fields[5], fields[6]) == (
        str(sid), "active +actions", "node=n1,kind=~gpu_.*", "cli", "riser swap",
    )  # fmt: skip
    assert run_cli("silence", "expire", str(sid), env=env).returncode == 0
    assert run_cli("silence", "list", env=env).stdout == ""
    assert run_cli("silence", "list", "--all", env=env).stdout.split("\t")[1] == "expired +actions"
    again = run_cli("silence", "expire", str(sid), env=env)
    assert again.returncode == 2 and "already expired" in again.stderr

    for args, named in [
        (["hostname=n1", "--duration", "1h"], "unknown label 'hostname'"),
        (["job=~(grpo", "--duration", "1h"], "bad regex"),
        (["job=~grpo-(?=a).*", "--duration", "1h"], "uses a lookahead (?=...)"),
        (["job=~(grpo)-\\1", "--duration", "1h"], "uses a backreference \\1"),
        (["node=n1", "--duration", "two hours"], "--duration 'two hours'"),
        (["node=n1", "--duration", "30d"], "longer than the maximum"),
        (["node=n1", "--ends", "2026-12-01T08:00:00"], "--ends '2026-12-01T08:00:00'"),
        (
            ["node=n1", "--starts", "2030-01-02T00:00:00Z", "--ends", "2030-01-01T00:00:00Z"],
            "is not after",
        ),
    ]:
        bad = run_cli("silence", "add", *args, "--comment", "x", env=env)
        assert bad.returncode == 2, (args, bad.stderr)
        assert named in bad.stderr and bad.stderr.startswith("rlguard: error: "), bad.stderr
    short = {**env, "RLGUARD_SILENCES__MAX_REGEX_CHARS": "8"}
    long = run_cli("silence", "add", "job=~grpo-a.*bc", "--duration", "1h", "--comment", "x",
                   env=short)  # fmt: skip
    assert long.returncode == 2 and "RLGUARD_SILENCES__MAX_REGEX_CHARS" in long.stderr, long.stderr
    assert "10 characters is over the limit of 8" in long.stderr
    with sa.create_engine(database_url).connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM silence")).scalar_one() == 1
        actions = [r[0] for r in conn.execute(sa.text("SELECT action FROM audit_event"))]
    assert actions == ["silence.create", "silence.expire"]
