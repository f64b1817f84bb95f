"""Schemathesis against a real server's /openapi.json: no 5xx and no response outside the schema.

Bounded: a fixed seed, a few examples per operation, two passes (user routes with an admin token,
ingest with a node token). The summary of what was tried is written to the test's log and kept
as the JSON report under the test's tmp dir.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sqlmodel import Session

from app.auth.tokens import create_node_token
from app.auth.users import create_user
from app.core import migrate
from app.core.db import make_engine
from app.models import Role
from tests.harness import RLGUARD, ServerProcess, free_port, rlguard_env

ST = str(Path(sys.executable).parent / "st")
CHECKS = "not_a_server_error,response_schema_conformance"

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(480)]


def _run(
    url: str, token: str, report: Path, *extra: str
) -> tuple[subprocess.CompletedProcess[str], dict]:
    argv = [
        ST,
        "run",
        f"{url}/openapi.json",
        "--checks",
        CHECKS,
        "--header",
        f"Authorization: Bearer {token}",
        "--max-examples",
        "15",
        "--seed",
        "20261129",
        "--phases",
        "examples,coverage,fuzzing",
        "--workers",
        "1",  # generation in threads trips a hypothesis cache race (KeyError)
        "--request-timeout",
        "20",
        "--generation-database",
        "none",
        "--no-color",
        "--report",
        "ndjson",
        "--report-ndjson-path",
        str(report),
        *extra,
    ]
    # ~40 s alone on 2 idle cores; 150 s beside three other xdist workers' servers and jobs
    r = subprocess.run(argv, capture_output=True, text=True, timeout=420)
    report.with_suffix(".txt").write_text(r.stdout + r.stderr)
    return r, _summary(report, r.stdout)


def _summary(report: Path, stdout: str) -> dict:
    """Operations tested (from the ndjson event stream) and test cases generated (its summary)."""
    operations: set[str] = set()
    if report.exists():
        for line in report.read_text().splitlines():
            scenario = json.loads(line).get("ScenarioFinished")
            if scenario and scenario.get("status") != "skip":
                operations.add(scenario["recorder"]["label"])
    generated = re.search(r"(\d+) generated", stdout)
    return {"operations": sorted(operations), "cases": int(generated.group(1)) if generated else 0}


def test_schemathesis_finds_no_server_error_and_no_schema_violation(
    postgres_url: str, redis_url: str, tmp_path: Path
) -> None:
    migrate.upgrade(postgres_url)
    engine = make_engine(postgres_url)
    with Session(engine) as s:
        admin = create_user(s, name="st-admin", role=Role.admin, actor="test")[1]
        node = create_node_token(s, node="st-node", actor="test")[1]
        s.commit()
    engine.dispose()
    port = free_port()
    env = rlguard_env(
        postgres_url,
        tmp_path / "data",
        RLGUARD_DEV="1",
        RLGUARD_REDIS_URL=redis_url,
        # Fuzzing is a flood by design; the limits themselves are tested elsewhere.
        RLGUARD_HARDENING__LOGIN_BURST="100000",
        RLGUARD_HARDENING__INGEST_BURST="100000",
    )
    server = ServerProcess(
        [*RLGUARD, "server", "--host", "127.0.0.1", "--port", str(port)],
        env,
        port,
        tmp_path / "server.log",
    )
    try:
        server.start(timeout=90)
        # Revoking or rotating a token by a generated id can hit the admin's own token and
        # leave every later operation answering 401: those two run last, in their own pass.
        # Likewise disabling or deleting a user by a name it read from GET /api/v1/users can
        # hit the admin itself once POST /api/v1/users made a second admin: the user lifecycle
        # routes get their own pass too, without POST /api/v1/users (the admin stays the last
        # enabled one, which they refuse to remove).
        api, api_ops = _run(
            server.url,
            admin,
            tmp_path / "api.ndjson",
            "--exclude-path",
            "/api/v1/ingest",
            "--exclude-path-regex",
            r"^/api/v1/(tokens/\{token_id\}|users/\{name\})",
        )
        users, users_ops = _run(
            server.url,
            admin,
            tmp_path / "users.ndjson",
            "--include-path-regex",
            r"^/api/v1/users/\{name\}",
        )
        tok, tok_ops = _run(
            server.url,
            admin,
            tmp_path / "tokens.ndjson",
            "--include-path-regex",
            r"^/api/v1/tokens/\{token_id\}",
        )
        ingest, ingest_ops = _run(
            server.url, node, tmp_path / "ingest.ndjson", "--include-path", "/api/v1/ingest"
        )
        print("schemathesis (admin token):", json.dumps(api_ops, sort_keys=True))  # noqa: T201
        print("schemathesis (node token):", json.dumps(ingest_ops, sort_keys=True))  # noqa: T201
        print("schemathesis (token revoke/rotate):", json.dumps(tok_ops, sort_keys=True))  # noqa: T201
        assert api.returncode == 0, api.stdout[-6000:] + api.stderr[-2000:]
        print("schemathesis (user lifecycle):", json.dumps(users_ops, sort_keys=True))  # noqa: T201
        assert users.returncode == 0, users.stdout[-6000:] + users.stderr[-2000:]
        assert len(users_ops["operations"]) == 4, users_ops
        assert "Authentication failed" not in users.stdout, users.stdout[-4000:]
        assert tok.returncode == 0, tok.stdout[-6000:] + tok.stderr[-2000:]
        assert len(tok_ops["operations"]) == 2, tok_ops
        # The admin token stayed valid through the main pass (see above).
        assert "DELETE /api/v1/tokens" not in api.stdout.split("Authentication failed")[-1]
        assert ingest.returncode == 0, ingest.stdout[-6000:] + ingest.stderr[-2000:]
        # It really exercised the API (a run that generated nothing would also exit 0).
        assert len(api_ops["operations"]) >= 20, api_ops
        assert "Authentication failed" not in api.stdout, api.stdout[-4000:]
        assert api_ops["cases"] >= 300, api_ops
        assert ingest_ops["operations"] == ["POST /api/v1/ingest"], ingest_ops
        assert ingest_ops["cases"] >= 50, ingest_ops
        assert "Traceback" not in server.output()
    finally:
        server.kill9()
