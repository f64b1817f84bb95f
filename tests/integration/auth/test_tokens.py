"""Token revocation and rotation through the API and the CLI."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlmodel import Session

from app.models import Role
from tests.harness import Api, auth, batch, rlguard_env, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _token_id(api: Api, plaintext: str) -> int:
    with Session(api.engine) as s:
        return s.execute(
            sa.text("SELECT id FROM api_token WHERE prefix = :p"), {"p": plaintext[:10]}
        ).scalar_one()


def test_rotate_a_node_token_through_the_api(hardened_api: Callable[..., Api]) -> None:
    api = hardened_api()
    admin = api.user_token("root", Role.admin)
    old = api.node_token("n1")
    old_id = _token_id(api, old)
    assert (
        api.client.post("/api/v1/ingest", json=batch("n1", 0), headers=auth(old)).status_code == 200
    )
    r = api.client.post(f"/api/v1/tokens/{old_id}/rotate", headers=auth(admin))
    assert r.status_code == 201, r.text
    new = r.json()["token"]
    assert new != old and r.json()["info"]["node"] == "n1"
    # The old token stops at once in this process; the new one carries on the same node.
    assert (
        api.client.post("/api/v1/ingest", json=batch("n1", 1), headers=auth(old)).status_code == 401
    )
    r = api.client.post("/api/v1/ingest", json=batch("n1", 1), headers=auth(new))
    assert r.status_code == 200 and r.json()["duplicate"] is False
    # Rotating a revoked token is refused and changes nothing.
    r = api.client.post(f"/api/v1/tokens/{old_id}/rotate", headers=auth(admin))
    assert r.status_code == 422 and f"token {old_id} is revoked" in r.json()["detail"]
    assert api.client.post("/api/v1/tokens/999999/rotate", headers=auth(admin)).status_code == 404
    operator = api.user_token("olga", Role.operator)
    new_id = _token_id(api, new)
    assert (
        api.client.post(f"/api/v1/tokens/{new_id}/rotate", headers=auth(operator)).status_code
        == 403
    )
    with Session(api.engine) as s:
        actions = [
            r[0]
            for r in s.execute(
                sa.text("SELECT action FROM audit_event WHERE action LIKE 'token.%' ORDER BY id")
            )
        ]
        tokens = s.execute(
            sa.text("SELECT count(*) FROM api_token WHERE node_name = 'n1' AND revoked_at IS NULL")
        ).scalar_one()
    i = actions.index("token.rotate")
    assert actions[i - 2 : i + 1] == ["token.create", "token.revoke", "token.rotate"]
    assert tokens == 1


def test_rotate_a_user_token_keeps_the_user(hardened_api: Callable[..., Api]) -> None:
    api = hardened_api()
    admin = api.user_token("root", Role.admin)
    viewer = api.user_token("vera", Role.viewer)
    r = api.client.post(f"/api/v1/tokens/{_token_id(api, viewer)}/rotate", headers=auth(admin))
    assert r.status_code == 201
    assert api.client.get("/api/v1/me", headers=auth(viewer)).status_code == 401
    me = api.client.get("/api/v1/me", headers=auth(r.json()["token"]))
    assert me.status_code == 200 and me.json()["name"] == "vera"


def test_cli_rotate_and_revoke(migrated_pg: str, tmp_path: Path) -> None:
    env = rlguard_env(migrated_pg, tmp_path / "data", RLGUARD_DEV="1")
    made = run_cli("token", "create", "--node", "n7", env=env)
    assert made.returncode == 0, made.stderr
    listed = run_cli("token", "list", env=env).stdout.splitlines()
    token_id = listed[-1].split("\t")[0]
    rotated = run_cli("token", "rotate", token_id, env=env)
    assert rotated.returncode == 0, rotated.stderr
    new = rotated.stdout.strip()
    assert new.startswith("rlgn_") and new != made.stdout.strip()
    assert f"token {token_id} revoked and replaced" in rotated.stderr
    again = run_cli("token", "rotate", token_id, env=env)
    assert again.returncode == 2 and f"token {token_id} is revoked" in again.stderr
    assert again.stdout == ""
    bad = run_cli("token", "rotate", "abc", env=env)
    assert bad.returncode == 2 and "Invalid value for 'token_id'" in bad.stderr
    missing = run_cli("token", "rotate", "424242", env=env)
    assert missing.returncode == 2 and "no token with id 424242" in missing.stderr
    states = [ln.split("\t")[-1] for ln in run_cli("token", "list", env=env).stdout.splitlines()]
    assert sorted(states) == ["active", "revoked"]
