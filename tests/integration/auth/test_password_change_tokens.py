"""A password change can revoke the user's API tokens (issue 41 item 6): `rlguard user
set-password NAME --password-stdin --revoke-tokens` and ``PUT /api/v1/users/{name}/password``
with ``"revoke_tokens": true``. Without it the tokens keep working, as the docs say. On SQLite
and PostgreSQL; bad values are named and change nothing."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlmodel import Session, select
from typer.testing import CliRunner

from app.cli import cli
from app.models import ApiToken, AuditEvent, Role
from tests.harness import Api, auth
from tests.harness.dashboard import PASSWORD
from tests.integration.auth._browser import add_user

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

NEW_PASSWORD = "a brand new password"


def works(api: Api, token: str) -> bool:
    status = api.client.get("/api/v1/me", headers=auth(token)).status_code
    assert status in (200, 401), status
    return status == 200


def login(api: Api, password: str) -> str:
    r = api.client.post("/api/v1/auth/token", json={"name": "vic", "password": password})
    assert r.status_code == 201, r.text
    token: str = r.json()["token"]
    return token


def last_password_audit(api: Api) -> dict[str, object]:
    with Session(api.engine) as s:
        row = s.exec(
            select(AuditEvent)
            .where(AuditEvent.action == "user.set_password")
            .order_by(AuditEvent.id.desc())  # type: ignore[union-attr]
        ).first()
    assert row is not None
    return dict(row.detail or {})


def test_the_api_revokes_tokens_only_when_asked(
    migrated_url: str, make_api: Callable[..., Api]
) -> None:
    api = make_api(migrated_url)
    admin = add_user(api, "root", Role.admin)
    first = add_user(api, "vic", Role.viewer)
    from_login = login(api, PASSWORD)

    def put(body: object) -> int:
        r = api.client.request("PUT", "/api/v1/users/vic/password", json=body, headers=auth(admin))
        return r.status_code

    assert put({"password": NEW_PASSWORD}) == 200
    assert works(api, first) and works(api, from_login)  # kept: the default, documented
    assert "tokens_revoked" not in last_password_audit(api)

    r = api.client.request(
        "PUT",
        "/api/v1/users/vic/password",
        json={"password": PASSWORD, "revoke_tokens": "maybe"},
        headers=auth(admin),
    )
    assert r.status_code == 422 and "revoke_tokens" in r.text
    assert works(api, first) and login(api, NEW_PASSWORD)  # nothing changed

    assert put({"password": PASSWORD, "revoke_tokens": True}) == 200
    assert not works(api, first) and not works(api, from_login)
    assert works(api, admin)  # another user's token is untouched
    revoked = last_password_audit(api)["tokens_revoked"]
    assert isinstance(revoked, list) and len(revoked) == 3  # add_user's, two logins
    assert works(api, login(api, PASSWORD))  # signing in again issues a working token


def test_the_cli_revokes_tokens_with_revoke_tokens(
    migrated_url: str, make_api: Callable[..., Api], tmp_path
) -> None:  # type: ignore[no-untyped-def]
    api = make_api(migrated_url)
    token = add_user(api, "vic", Role.viewer)
    env = {"RLGUARD_DATABASE_URL": migrated_url, "RLGUARD_DATA_DIR": str(tmp_path)}

    def run(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(
            cli,
            ["user", "set-password", *args, "--password-stdin"],
            input=NEW_PASSWORD + "\n",
            env=env,
        )
        return result.exit_code, result.output

    code, out = run("vic")
    assert code == 0 and "API tokens still work: --revoke-tokens revokes them" in out
    assert works(api, token)
    code, out = run("ghost", "--revoke-tokens")
    assert code == 2 and "'ghost'" in out and works(api, token)
    code, out = run("vic", "--revoke-tokens")
    assert code == 0 and "API tokens revoked" in out, out
    assert not works(api, token)
    with Session(api.engine) as s:
        assert all(t.revoked_at is not None for t in s.exec(select(ApiToken)).all())
    assert works(api, login(api, NEW_PASSWORD))
