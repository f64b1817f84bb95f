"""``rlguard breaker list|reset`` on a migrated database, in-process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlmodel import Session
from typer.testing import CliRunner

from app.cli import cli
from app.core import migrate
from app.core.db import make_engine
from app.models.guardrails import CircuitBreaker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def url(sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    for k in list(os.environ):
        if k.startswith("RLGUARD_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("RLGUARD_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("RLGUARD_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("RLGUARD_DEV", "1")
    migrate.upgrade(sqlite_url)
    return sqlite_url


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, list(args))


def test_breaker_list_and_reset(url: str) -> None:
    empty = invoke("breaker", "list")
    assert empty.exit_code == 0 and empty.stdout == "" and "no breaker ever tripped" in empty.stderr
    engine = make_engine(url)
    with Session(engine) as s:
        s.add(
            CircuitBreaker(
                scope="job:grpo-1",
                open=True,
                reason="21 automatic actions in 10 min (limit 20)",
                trips=1,
            )
        )
        s.commit()
    listed = invoke("breaker", "list")
    assert listed.exit_code == 0
    assert listed.stdout.startswith("job:grpo-1\tOPEN\ttripped -: 21 automatic actions in 10 min")
    for args, words in [
        (("breaker", "reset", "jobs:grpo-1"), "invalid breaker scope 'jobs:grpo-1'"),
        (("breaker", "reset", "job:"), "invalid breaker scope 'job:'"),
        (("breaker", "reset", "job:other"), "breaker 'job:other' never tripped"),
    ]:
        bad = invoke(*args)
        assert bad.exit_code == 2 and bad.stdout == "", (args, bad.output)
        assert bad.stderr.strip().startswith(f"rlguard: error: {words}")
    ok = invoke("breaker", "reset", "job:grpo-1", "--comment", "image fixed")
    assert ok.exit_code == 0, ok.output
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT open, reset_by FROM circuit_breaker")).one() == (
            False,
            "cli",
        )
        audit = conn.execute(
            sa.text("SELECT actor, target FROM audit_event WHERE action = 'breaker.reset'")
        ).one()
        assert tuple(audit) == ("cli", "job:grpo-1")
    again = invoke("breaker", "reset", "job:grpo-1")
    assert again.exit_code == 2 and "breaker 'job:grpo-1' is not open" in again.stderr
    engine.dispose()
