"""A real ``rlguard server`` process and a real headless Chromium for the browser tests.

The server gets its own data directory (SQLite, generated secret), users created through the CLI
(``rlguard user create --password-stdin``), and a node token (``rlguard token create``); data
reaches it only through ``POST /api/v1/ingest``, as an agent would send it. Chromium is Debian's
(``/usr/bin/chromium``): Playwright's own browser download cannot work on this machine.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest

from tests.e2e._cluster import (
    NODES,
    PASSWORDS,
    Cluster,
    _cli,
)
from tests.harness import RLGUARD, ServerProcess, free_port
from tests.harness.chromium import chromium


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    data_dir = tmp_path_factory.mktemp("rlguard-e2e")
    port = free_port()
    env = {
        **os.environ,
        "RLGUARD_DATA_DIR": str(data_dir),
        "RLGUARD_SECRET_KEY": secrets.token_urlsafe(32),
        "RLGUARD_HOST": "127.0.0.1",
        "RLGUARD_PORT": str(port),
    }
    for key in ("RLGUARD_DATABASE_URL", "RLGUARD_REDIS_URL", "RLGUARD_DEV", "RLGUARD_ALERTS_FILE"):
        env.pop(key, None)
    _cli(env, "db", "upgrade")
    user_tokens = {
        name: _cli(
            env,
            "user",
            "create",
            name,
            "--role",
            role,
            "--password-stdin",
            stdin=PASSWORDS[name] + "\n",
        )
        for name, role in (("alice", "approver"), ("vera", "viewer"))
    }
    tokens = {node: _cli(env, "token", "create", "--node", node) for node in NODES}
    log_path = data_dir / "server.log"
    argv = [*RLGUARD, "server", "--host", "127.0.0.1", "--port", str(port)]
    server = ServerProcess(argv, env, port, log_path, ready_path="/healthz")
    try:
        process = server.start().proc
        assert process is not None
        yield Cluster(server.url, data_dir, env, tokens, user_tokens, process, log_path)
    finally:
        server.stop(timeout=20)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with chromium() as b:
        yield b
