"""A cookie-keeping browser that can talk to several replicas of the app, and users with a
login password, for the auth integration tests."""

from __future__ import annotations

import functools
from typing import Any

import httpx
from argon2 import PasswordHasher
from sqlmodel import Session

from app.auth.users import create_user
from app.models import Role
from tests.harness.apps import Api
from tests.harness.dashboard import PASSWORD, csrf_from, password_hash


def add_user(api: Api, name: str, role: Role, password: str = PASSWORD) -> str:
    """A user with a login password; returns their first API token."""
    with Session(api.engine) as s:
        user, token = create_user(s, name=name, role=role, actor="test")
        # One argon2 hash of PASSWORD for every test user (app.auth.users hashes the same
        # way): hashing is the slow part of these tests.
        user.password_hash = (
            password_hash() if password == PASSWORD else PasswordHasher().hash(password)
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
