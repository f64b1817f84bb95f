"""An app in the test process: its lifespan entered, driven through a blocking HTTP client,
with helpers to mint tokens in its database; and the bodies tests send it."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import httpx
from anyio.from_thread import BlockingPortal, start_blocking_portal
from fastapi import FastAPI
from sqlmodel import Session

from app.auth.tokens import create_node_token
from app.auth.users import create_user
from app.core.config import Settings
from app.models import Role


def make_settings(url: str, data_dir: Path, **overrides: object) -> Settings:
    return Settings(dev=True, database_url=url, data_dir=data_dir, **overrides)  # type: ignore[arg-type]


class AppClient:
    """A blocking HTTP client for an ASGI app with its lifespan entered.

    (Starlette's TestClient warns that its httpx support is deprecated and warnings are errors
    here; this is the same idea: an httpx.AsyncClient driven from a blocking portal.)
    """

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self._portal_cm = start_blocking_portal()
        self._portal: BlockingPortal = self._portal_cm.__enter__()
        self._lifespan = self._portal.wrap_async_context_manager(app.router.lifespan_context(app))
        self._lifespan.__enter__()
        self._client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://testserver"
        )
        self._closed = False

    def request(self, method: str, url: str, **kwargs: object) -> httpx.Response:
        return self._portal.call(functools.partial(self._client.request, method, url, **kwargs))  # type: ignore[arg-type]

    def get(self, url: str, **kwargs: object) -> httpx.Response:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: object) -> httpx.Response:
        return self.request("POST", url, **kwargs)

    def delete(self, url: str, **kwargs: object) -> httpx.Response:
        return self.request("DELETE", url, **kwargs)

    def close(self) -> None:
        """Shut the app down (its lifespan exits); safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._portal.call(self._client.aclose)
        self._lifespan.__exit__(None, None, None)
        self._portal_cm.__exit__(None, None, None)


class Api:
    """A running app (lifespan entered) plus helpers to mint tokens directly in its database."""

    def __init__(self, client: AppClient) -> None:
        self.client = client
        self.app = client.app

    @property
    def engine(self):  # type: ignore[no-untyped-def]
        return self.app.state.engine  # type: ignore[attr-defined]

    def node_token(self, node: str) -> str:
        with Session(self.engine) as s:
            _t, plaintext = create_node_token(s, node=node, actor="test")
            s.commit()
        return plaintext

    def user_token(self, name: str, role: Role) -> str:
        with Session(self.engine) as s:
            _u, token = create_user(s, name=name, role=role, actor="test")
            s.commit()
        return token


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def batch(node: str, seq: int, *, agent: str = "agent-1", n: int = 3, **extra: object) -> dict:
    now = time.time()
    body: dict = {
        "agent_id": agent,
        "node": node,
        "seq": seq,
        "sent_at": now,
        "samples": [
            {
                "name": "gpu_util",
                "value": float(i),
                "ts": now - n + i,
                "labels": {"gpu": str(i % 2)},
            }
            for i in range(n)
        ],
    }
    body.update(extra)
    return body
