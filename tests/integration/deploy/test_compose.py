"""docker-compose.yml validates against the Compose specification (no Docker engine needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
CHECK = Path(sys.executable).parent / "check-jsonschema"

pytestmark = [pytest.mark.timeout(120)]


def test_compose_file_matches_the_compose_spec() -> None:
    r = subprocess.run(
        [str(CHECK), "--builtin-schema", "vendor.compose-spec", str(ROOT / "docker-compose.yml")],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_compose_has_the_foundation_services_wired_together() -> None:
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert {"postgres", "redis", "server"} <= set(doc["services"])
    server = doc["services"]["server"]
    env = server["environment"]
    assert env["RLGUARD_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert env["RLGUARD_REDIS_URL"] == "redis://redis:6379/0"
    assert "?" in env["RLGUARD_SECRET_KEY"]  # required: no default secret in the compose file
    assert server["depends_on"]["postgres"]["condition"] == "service_healthy"
    # Migrations run once, in the one-shot migrate service the server waits for (issue 11).
    assert server["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert doc["services"]["migrate"]["command"] == ["rlguard", "db", "upgrade"]


def test_an_invalid_compose_file_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "docker-compose.yml"
    bad.write_text("services:\n  server:\n    image: 5\n    ports: oops\n")
    r = subprocess.run(
        [str(CHECK), "--builtin-schema", "vendor.compose-spec", str(bad)],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert r.returncode != 0
