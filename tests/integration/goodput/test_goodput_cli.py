"""``rlguard report``: the ledger of the history in ``_history`` as a table and as Markdown;
bad values end in one ``rlguard: error:`` line naming them, exit 2."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import cli
from app.core import migrate
from app.models import Role
from tests.harness import Api
from tests.integration.goodput._history import (
    JOB,
    build_incidents,
    ingest_steps,
    start,
    trainer_steps,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def test_report_table_markdown_and_bad_values(
    sqlite_url: str,
    make_api: Callable[..., Api],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    migrate.upgrade(sqlite_url)
    api = make_api(sqlite_url)
    t0 = start()
    ingest_steps(api, t0, job=JOB, steps=trainer_steps())
    api.user_token("alice", Role.approver)
    ids = build_incidents(api.engine, t0)
    for k in list(os.environ):
        if k.startswith("RLGUARD_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("RLGUARD_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("RLGUARD_DATA_DIR", str(tmp_path / "cli-data"))
    monkeypatch.setenv("RLGUARD_DEV", "1")
    monkeypatch.setenv("COLUMNS", "200")
    md = tmp_path / "weekly.md"
    window = ["--since", _iso(t0 - 60), "--until", _iso(t0 + 900)]
    result = CliRunner().invoke(cli, ["report", "--job", JOB, *window, "--markdown", str(md)])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "ETTR" in out and "0.677" in out  # 650 / 960
    assert "5m 10s" in out  # lost: 310 s
    assert "16 (default)" in out and "$3.44" in out  # 310 s x 2 nodes x 8 GPUs x $2.5
    text = md.read_text()
    assert f"# Goodput of job `{JOB}`" in text
    row_c = next(line for line in text.splitlines() if line.startswith(f"| {ids['C']} |"))
    # detect 5 s, approve 4m 00s (SAFE_MODE waiting for an approver), recover 5 s, redo 10 s
    assert "| 5s | 4m 00s | 5s | 10s | 4m 20s | 4m 20s | 0 |" in row_c
    assert "| human detection delay | 30m 00s |" in text
    assert "| price per GPU-hour | $2.50 |" in text

    def error(*args: str) -> str:
        r = CliRunner().invoke(cli, list(args))
        assert r.exit_code == 2, (r.exit_code, r.output)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("rlguard: error: "), r.stderr
        return lines[0]

    assert "--since 'last week' is neither a duration" in error(
        "report", "--job", JOB, "--since", "last week"
    )
    assert "--until '3x'" in error("report", "--job", JOB, "--until", "3x")
    assert "no job named 'nope'" in error("report", "--job", "nope")
    missing = tmp_path / "no-dir" / "r.md"
    assert "does not exist" in error("report", "--job", JOB, "--markdown", str(missing))
    assert not missing.parent.exists()
