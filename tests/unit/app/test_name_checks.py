"""Name checks match the whole string: Python's ``$`` also matches before a trailing newline, so a
name such as ``"n9\\n"`` passed a ``re.match(r"^...$")`` check and made a node that could never
ingest (the ingest body's pydantic check refused it) or a user ``"admin\\n"`` that looks like
``admin``. One test per entry point."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import orjson
import pytest
from sqlmodel import Session
from typer.testing import CliRunner

from agents.__main__ import _node, _packages, _size
from app.auth.tokens import create_node_token, validate_node_name
from app.auth.users import create_user
from app.cli import cli
from app.core import migrate
from app.core.config import IngestLimits
from app.core.db import make_engine
from app.core.errors import InvalidInput
from app.ingest.validation import BatchValidator, IngestRejected
from app.models import Role
from recovery.batch import _BATCH_ID
from recovery.report import JOB_PATTERN, PHASE_PATTERN, safe_job_name

TRAILING = ["n9\n", "n9\r\n", "\nn9", "n9\n\n"]


@pytest.mark.parametrize("name", TRAILING)
def test_node_token_refuses_a_name_with_a_newline(name: str) -> None:
    with pytest.raises(InvalidInput, match="invalid node name"):
        validate_node_name(name)


@pytest.mark.parametrize("name", ["admin\n", "admin\r\n", "ad\nmin"])
def test_user_create_refuses_a_name_with_a_newline(name: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    try:
        with Session(engine) as s:
            with pytest.raises(InvalidInput, match="invalid user name"):
                create_user(s, name=name, role=Role.admin, actor="test")
            with pytest.raises(InvalidInput, match="invalid node name"):
                create_node_token(s, node="n9\n", actor="test")
    finally:
        engine.dispose()


def _body(**override: object) -> bytes:
    now = time.time()
    body: dict[str, object] = {
        "agent_id": "agent-1",
        "node": "n9",
        "seq": 0,
        "sent_at": now,
        "samples": [{"name": "gpu_util", "value": 1.0, "ts": now, "labels": {"gpu": "0"}}],
        "participants": [
            {"job": "j", "role": "trainer", "rank": 0, "phase": "train", "step": 1, "ts": now}
        ],
    }
    body.update(override)
    return orjson.dumps(body)


def _participant(**override: object) -> list[dict[str, object]]:
    p: dict[str, object] = {
        "job": "j",
        "role": "trainer",
        "rank": 0,
        "phase": "train",
        "step": 1,
        "ts": time.time(),
    }
    p.update(override)
    return [p]


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"node": "n9\n"}, "node"),
        ({"agent_id": "agent-1\n"}, "agent_id"),
        ({"participants": _participant(job="j\n")}, "participants.0.job"),
        ({"participants": _participant(role="trainer\n")}, "participants.0.role"),
        ({"participants": _participant(phase="train\n")}, "participants.0.phase"),
        ({"samples": [{"name": "gpu_util\n", "value": 1.0, "ts": 1.0}]}, "samples[0].name"),
        (
            {"samples": [{"name": "g", "value": 1.0, "ts": 1.0, "labels": {"gpu\n": "0"}}]},
            "samples[0].labels",
        ),
    ],
)
def test_ingest_refuses_names_with_a_newline(override: dict[str, object], field: str) -> None:
    validator = BatchValidator(IngestLimits())
    validator.validate(_body())  # the same body without the newline passes
    with pytest.raises(IngestRejected, match=field.replace("[", r"\[").replace("]", r"\]")):
        validator.validate(_body(**override))


def test_agent_cli_refuses_a_node_name_with_a_newline() -> None:
    assert _node("n9") == "n9"
    with pytest.raises(argparse.ArgumentTypeError, match="got 'n9\\\\n'"):
        _node("n9\n")
    with pytest.raises(argparse.ArgumentTypeError, match="not a package name"):
        _packages("torch\n\n,numpy\nx")
    assert _size("1G") == 1 << 30


def test_job_and_phase_patterns_match_whole_strings() -> None:
    assert JOB_PATTERN.fullmatch("job-1") and not JOB_PATTERN.fullmatch("job-1\n")
    assert PHASE_PATTERN.fullmatch("train") and not PHASE_PATTERN.fullmatch("train\n")
    assert _BATCH_ID.fullmatch("b1") and not _BATCH_ID.fullmatch("b1\n")
    assert safe_job_name("job-1") == "job-1"


@pytest.mark.parametrize(
    "args",
    [
        ["user", "create", "admin\n", "--role", "admin"],
        ["token", "create", "--node", "n9\n"],
    ],
)
def test_cli_refuses_a_name_with_a_newline(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    migrate.upgrade(url)
    monkeypatch.setenv("RLGUARD_DATABASE_URL", url)
    monkeypatch.setenv("RLGUARD_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("RLGUARD_DEV", "1")
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "invalid" in result.output and "\\n'" in result.output
