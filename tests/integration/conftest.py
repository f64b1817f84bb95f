"""Fixtures for the foundation's integration tests: migrated databases, apps, real servers."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from fastapi import FastAPI
from sqlmodel import Session

from app.core import migrate
from app.core.config import Settings
from app.main import create_app
from app.models import Role
from app.services.tokens import create_node_token
from app.services.users import create_user
from tests.conftest import free_port


@pytest.fixture
def migrated_url(database_url: str) -> str:
    """A database (SQLite and PostgreSQL, by parametrization) at the latest revision."""
    migrate.upgrade(database_url)
    return database_url


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


@pytest.fixture
def make_api(tmp_path: Path) -> Iterator[Callable[..., Api]]:
    clients: list[AppClient] = []

    def factory(url: str, **overrides: object) -> Api:
        # The foundation alone: later features' lifespans (the policy tick) are left out here;
        # the real `rlguard server` subprocesses in these tests run with them.
        settings = make_settings(url, tmp_path / f"data{len(clients)}", **overrides)
        app = create_app(settings, extra_lifespans=[])
        client = AppClient(app)
        clients.append(client)
        return Api(client)

    yield factory
    for c in reversed(clients):
        c.close()


@pytest.fixture
def api(migrated_url: str, make_api: Callable[..., Api]) -> Api:
    return make_api(migrated_url)


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
            {"name": "gpu_util", "value": float(i), "ts": now - n + i, "labels": {"gpu": str(i % 2)}}
            for i in range(n)
        ],
    }
    body.update(extra)
    return body


class ServerProcess:
    """A real ``rlguard`` server subprocess; always killed at teardown."""

    def __init__(self, argv: list[str], env: dict[str, str], port: int, log: Path) -> None:
        self.argv, self.env, self.port, self.log_path = argv, env, port, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"http://127.0.0.1:{port}"

    def start(self, *, wait_ready: bool = True, timeout: float = 60.0) -> ServerProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        if wait_ready:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass  # not listening yet
            time.sleep(0.1)
        raise AssertionError(f"server not ready after {timeout} s:\n{self.output()}")

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill9()


RLGUARD = [str(Path(sys.executable).parent / "rlguard")]


def rlguard_env(url: str | None, data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLGUARD_")}
    env["RLGUARD_DATA_DIR"] = str(data_dir)
    if url is not None:
        env["RLGUARD_DATABASE_URL"] = url
    env.update(extra)
    return env


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    servers: list[ServerProcess] = []

    def factory(command: str, env: dict[str, str], port: int | None = None) -> ServerProcess:
        port = port or free_port()
        argv = [*RLGUARD, command, "--host", "127.0.0.1", "--port", str(port)]
        s = ServerProcess(argv, env, port, tmp_path / f"server-{len(servers)}.log")
        servers.append(s)
        return s

    yield factory
    for s in servers:
        s.kill9()


def run_cli(*args: str, env: dict[str, str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RLGUARD, *args], env=env, input=stdin, capture_output=True, text=True, timeout=60
    )
