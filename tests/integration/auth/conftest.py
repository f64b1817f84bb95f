"""Apps (lifespan entered) on a migrated PostgreSQL database, and browsers for their pages.

Several apps made by one test share the database, as server replicas do: whatever a test proves
across two of them holds for replicas behind the reference proxy.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from argon2 import PasswordHasher
from sqlmodel import Session

from app.core import migrate
from app.main import create_app
from app.models import Role
from app.services.users import create_user
from tests.integration.foundation.conftest import Api, AppClient, make_settings
from tests.unit.app.views.conftest import PASSWORD, csrf_from
from tests.unit.app.views.conftest import _password_hash as password_hash

pytestmark = [pytest.mark.integration]


@pytest.fixture
def auth_db_url(postgres_url: str) -> str:
    """The database the replicas share (PostgreSQL, as deployed); a module may override it."""
    return postgres_url


@pytest.fixture
def make_replica(auth_db_url: str, tmp_path: Path) -> Iterator[Callable[..., Api]]:
    migrate.upgrade(auth_db_url)
    clients: list[AppClient] = []

    def factory(**overrides: object) -> Api:
        settings = make_settings(auth_db_url, tmp_path / f"data{len(clients)}", **overrides)
        client = AppClient(create_app(settings, extra_lifespans=[]))
        clients.append(client)
        return Api(client)

    yield factory
    for c in reversed(clients):
        c.close()


def add_user(api: Api, name: str, role: Role, password: str = PASSWORD) -> str:
    """A user with a login password; returns their first API token."""
    with Session(api.engine) as s:
        user, token = create_user(s, name=name, role=role, actor="test")
        # One argon2 hash of PASSWORD for every test user (app.services.users hashes the same
        # way): hashing is the slow part of these tests.
        user.password_hash = password_hash() if password == PASSWORD else PasswordHasher().hash(
            password
        )
        s.add(user)
        s.commit()
    return token


class Browser:
    """One browser's cookies, sent to any replica: ``on(other)`` is the same browser (or a
    copy of its cookies) talking to another app. Cookies are kept by hand, by name, so a test
    can copy one to another browser as an attacker would."""

    def __init__(self, api: Api, base_url: str = "http://testserver") -> None:
        self.api = api
        self.base_url = base_url
        self.cookies: dict[str, str] = {}
        self._client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=api.app), base_url=base_url
        )

    def on(self, api: Api, *, share: bool = True) -> Browser:
        other = Browser(api, self.base_url)
        other.cookies = self.cookies if share else dict(self.cookies)
        return other

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = dict(kwargs.pop("headers", None) or {})
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        call = functools.partial(self._client.request, method, path, headers=headers, **kwargs)
        response: httpx.Response = self.api.client._portal.call(call)
        self._client.cookies.clear()  # only self.cookies is this browser's jar
        for line in response.headers.get_list("set-cookie"):
            name, _, rest = line.partition("=")
            value = rest.split(";", 1)[0].strip('"')
            if "max-age=0" in line.lower() or not value:
                self.cookies.pop(name, None)
            else:
                self.cookies[name] = value
        return response

    def get(self, path: str, **kwargs: object) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: object) -> httpx.Response:
        return self.request("POST", path, **kwargs)

    def login(self, name: str, password: str = PASSWORD) -> httpx.Response:
        form = self.get("/login")
        return self.post(
            "/login",
            data={"username": name, "password": password, "csrf_token": csrf_from(form.text)},
        )

    def csrf(self) -> str:
        page = self.get("/settings")
        assert page.status_code == 200, page.status_code
        return csrf_from(page.text)

    def signed_in(self) -> bool:
        """True when /settings renders; a signed-out browser is sent to /login (303)."""
        status = self.get("/settings").status_code
        assert status in (200, 303), status
        return status == 200
