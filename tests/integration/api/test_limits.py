"""Rate limits (429 + Retry-After), request size limits and security headers on a real app."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import sqlalchemy as sa
from sqlmodel import Session

from app.auth.users import create_user
from app.core.config import HardeningSettings
from app.models import Role
from tests.harness import Api, auth, batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _user_with_password(api: Api, name: str, password: str) -> None:
    with Session(api.engine) as s:
        create_user(s, name=name, role=Role.viewer, password=password, actor="test")
        s.commit()


def test_login_attempts_are_limited_per_client(hardened_api: Callable[..., Api]) -> None:
    api = hardened_api(hardening=HardeningSettings(login_attempts_per_minute=6, login_burst=3))
    _user_with_password(api, "lena", "correct horse battery")
    wrong = {"name": "lena", "password": "guess"}
    codes = [api.client.post("/api/v1/auth/token", json=wrong).status_code for _ in range(3)]
    assert codes == [401, 401, 401]
    refused = api.client.post("/api/v1/auth/token", json=wrong)
    assert refused.status_code == 429
    # One attempt per 10 s refills; password hashing took part of that already.
    assert 1 <= int(refused.headers["retry-after"]) <= 10
    assert "too many login attempts" in refused.json()["detail"]
    # Even the right password is refused now: guessing gains nothing by trying it later.
    right = api.client.post(
        "/api/v1/auth/token", json={"name": "lena", "password": "correct horse battery"}
    )
    assert right.status_code == 429
    # The dashboard's login form shares the same budget.
    assert api.client.post("/login", data={"username": "lena", "password": "x"}).status_code == 429
    with Session(api.engine) as s:
        logins = s.execute(
            sa.text("SELECT count(*) FROM audit_event WHERE action = 'auth.login'")
        ).scalar_one()
    assert logins == 0


def test_ingest_is_limited_per_token_and_a_refused_batch_changes_nothing(
    hardened_api: Callable[..., Api],
) -> None:
    api = hardened_api(hardening=HardeningSettings(ingest_requests_per_second=0.5, ingest_burst=2))
    t1, t2 = api.node_token("n1"), api.node_token("n2")
    for seq in (0, 1):
        r = api.client.post("/api/v1/ingest", json=batch("n1", seq), headers=auth(t1))
        assert r.status_code == 200 and r.json()["duplicate"] is False
    r = api.client.post("/api/v1/ingest", json=batch("n1", 2), headers=auth(t1))
    assert r.status_code == 429 and r.headers["retry-after"] == "2"
    assert r.headers["connection"] == "close"  # its body was not read: not parsed either
    assert "ingest requests" in r.json()["detail"]
    # Another node's token has its own bucket.
    assert (
        api.client.post("/api/v1/ingest", json=batch("n2", 0), headers=auth(t2)).status_code == 200
    )
    # seq 2 was not applied: the dedupe window does not know it.
    with Session(api.engine) as s:
        high = s.execute(
            sa.text("SELECT high_seq FROM ingest_cursor WHERE node_name = 'n1'")
        ).scalar_one()
    assert high == 1


def test_request_bodies_over_the_limit_get_413_everywhere(hardened_api: Callable[..., Api]) -> None:
    api = hardened_api(hardening=HardeningSettings(max_request_body_bytes=2048))
    admin = api.user_token("root", Role.admin)
    big = {"name": "x" * 4096, "role": "viewer"}
    r = api.client.post("/api/v1/users", json=big, headers=auth(admin))
    assert r.status_code == 413 and "limit of 2048" in r.json()["detail"]

    async def chunks():  # type: ignore[no-untyped-def]  # no Content-Length: chunked upload
        for _ in range(10):
            yield b"x" * 512

    r = api.client.post("/api/v1/users", content=chunks(), headers=auth(admin))
    assert r.status_code == 413
    r = api.client.post("/login", data={"username": "u" * 4000, "password": "p"})
    assert r.status_code == 413
    # Ingest keeps its own (larger) bound and still works with a body over 2 KiB.
    tok = api.node_token("n1")
    r = api.client.post("/api/v1/ingest", json=batch("n1", 0, n=40), headers=auth(tok))
    assert r.status_code == 200, r.text
    with Session(api.engine) as s:
        users = s.execute(sa.text("SELECT count(*) FROM user_account")).scalar_one()
    assert users == 1  # only root


def test_security_headers_on_api_pages_errors_and_static(hardened_api: Callable[..., Api]) -> None:
    api = hardened_api()
    for path, status in (
        ("/healthz", 200),
        ("/login", 200),
        ("/api/v1/incidents", 401),
        ("/nope", 404),
        ("/openapi.json", 200),
    ):
        r = api.client.get(path)
        assert r.status_code == status, path
        h = r.headers
        assert h["x-content-type-options"] == "nosniff", path
        assert h["x-frame-options"] == "DENY", path
        assert "frame-ancestors 'none'" in h["content-security-policy"], path
        assert h["referrer-policy"] == "same-origin", path
        assert "strict-transport-security" not in h  # plain HTTP here
    # The dashboard's own CSP (scripts from 'self') is kept, not replaced by the default.
    assert "script-src 'self'" in api.client.get("/login").headers["content-security-policy"]


def test_bad_hardening_values_are_refused_by_name() -> None:
    from pydantic import ValidationError

    for field, value in (
        ("max_request_body_bytes", 0),
        ("login_burst", 0),
        ("ingest_requests_per_second", -1),
    ):
        with pytest.raises(ValidationError, match=field):
            HardeningSettings(**{field: value})


def test_an_id_beyond_the_column_is_bad_input_not_a_server_error(
    hardened_api: Callable[..., Api],
) -> None:
    api = hardened_api()
    admin = api.user_token("root", Role.admin)
    r = api.client.post("/api/v1/approvals/72624877286856/reject", headers=auth(admin))
    assert r.status_code == 422, r.text  # was 500 (found by schemathesis)
    assert "does not fit the database" in r.json()["detail"]
    assert api.client.get("/api/v1/me", headers=auth(admin)).status_code == 200  # still serving
