"""The reference nginx config (deploy/nginx/rlguard.conf) in front of a real ``rlguard server``
with ``--trusted-proxy`` (issue 17 item 3).

nginx listens on 127.0.0.1 and reaches the server from 127.0.0.5 (``proxy_bind``), the one
trusted proxy; the clients connect from other loopback addresses (127.0.0.2 the attacker,
127.0.0.3 the admin), so the server tells them apart only through the X-Forwarded-For nginx
appends. The site config is the shipped file with its two Docker names (the upstream
``server:8000`` and ``listen 8000``) pointed at this test's ports; the wrapping ``http`` block
adds only temp paths and the ``proxy_bind``. A client on 127.0.0.1 talking to the server
directly shows that 127.0.0.1 is not trusted unless configured (uvicorn's own proxy-header
handling, which would trust it, is off).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlmodel import Session

from app.auth.users import create_user
from app.core import migrate
from app.core.db import make_engine
from app.models import Role
from tests.harness import RLGUARD, ServerProcess, free_port, rlguard_env, spawn, wait_for
from tests.harness.dashboard import PASSWORD

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parents[3]
NGINX = "/usr/sbin/nginx"
ATTACKER, ADMIN, PROXY_ADDR = "127.0.0.2", "127.0.0.3", "127.0.0.5"


def _nginx_conf(tmp: Path, listen_port: int, upstream_port: int) -> Path:
    site = (ROOT / "deploy/nginx/rlguard.conf").read_text()
    assert "server server:8000" in site and "listen 8000;" in site, "config changed shape"
    site = site.replace("server server:8000", f"server 127.0.0.1:{upstream_port}")
    site = site.replace("listen 8000;", f"listen 127.0.0.1:{listen_port};")
    (tmp / "rlguard.conf").write_text(site)
    temp = "".join(
        f"    {kind}_temp_path {tmp}/{kind};\n"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    user = "user root;\n" if os.geteuid() == 0 else ""  # workers must reach the tmp dir
    main = tmp / "nginx.conf"
    main.write_text(
        f"{user}daemon off;\nworker_processes 1;\npid {tmp}/nginx.pid;\n"
        f"error_log {tmp}/error.log;\nevents {{}}\n"
        # nginx reaches the server from PROXY_ADDR, so that 127.0.0.1 can be an untrusted
        # client of the server here (uvicorn would trust it by default).
        f"http {{\n    access_log off;\n    proxy_bind {PROXY_ADDR};\n{temp}"
        f"    include {tmp}/rlguard.conf;\n}}\n"
    )
    return main


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(URL through nginx, URL of the server itself)."""
    if not os.access(NGINX, os.X_OK):
        pytest.fail(f"{NGINX} is missing: run scripts/system-deps.sh (installs nginx-light)")
    db = f"sqlite:///{tmp_path / 'rlguard.db'}"
    migrate.upgrade(db)
    engine = make_engine(db)
    with Session(engine) as s:
        create_user(s, name="root", role=Role.admin, password=PASSWORD, actor="test")
        s.commit()
    engine.dispose()
    env = rlguard_env(
        db,
        tmp_path,
        RLGUARD_DEV="1",
        RLGUARD_HARDENING__LOGIN_ATTEMPTS_PER_MINUTE="6",
        RLGUARD_HARDENING__LOGIN_BURST="3",
    )
    port, nginx_port = free_port(), free_port()
    server = ServerProcess(
        [*RLGUARD, "server", "--port", str(port), "--trusted-proxy", PROXY_ADDR],
        env,
        port,
        tmp_path / "server.log",
    ).start()
    nginx_dir = tmp_path / "nginx"
    nginx_dir.mkdir()
    conf = _nginx_conf(nginx_dir, nginx_port, port)
    proc = spawn(
        [NGINX, "-p", str(nginx_dir), "-c", str(conf), "-e", str(nginx_dir / "error.log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{nginx_port}"
    try:

        def answers() -> bool:
            assert proc.poll() is None, (nginx_dir / "error.log").read_text(errors="replace")
            try:
                return httpx.get(url + "/healthz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False  # nginx not listening yet

        wait_for(answers, 20, "nginx /healthz", interval=0.05)
        yield url, server.url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
        server.stop()


def client_from(address: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=10)


def login(client: httpx.Client, url: str, password: str, **headers: str) -> int:
    r = client.post(
        url + "/api/v1/auth/token", json={"name": "root", "password": password}, headers=headers
    )
    return r.status_code


def test_behind_the_reference_proxy_one_attacker_locks_out_only_itself_and_hsts_is_sent(
    proxied: tuple[str, str],
) -> None:
    url, direct = proxied
    with client_from(ATTACKER) as attacker, client_from(ADMIN) as admin:
        # Claiming to be the admin's address: nginx appends the real peer, which is what counts.
        spoof = {"X-Forwarded-For": ADMIN}
        codes = [login(attacker, url, "guess", **spoof) for _ in range(4)]
        assert codes == [401, 401, 401, 429]
        assert login(attacker, url, PASSWORD) == 429
        assert login(admin, url, PASSWORD) == 201
        # Straight to the server, the attacker is not a trusted proxy: its header is ignored,
        # and its own address is still locked.
        assert login(attacker, direct, PASSWORD, **spoof) == 429
    # 127.0.0.1 is no proxy here: whatever it claims, its attempts share one bucket.
    with client_from("127.0.0.1") as local:
        codes = [
            login(local, direct, "guess", **{"X-Forwarded-For": f"192.0.2.{i}"})
            for i in range(1, 5)
        ]
        assert codes == [401, 401, 401, 429]
    with client_from(ADMIN) as admin:
        # A TLS terminator in front of nginx says https; nginx passes that on, the server
        # believes nginx and sends HSTS. Plain HTTP gets none.
        r = admin.get(url + "/healthz", headers={"X-Forwarded-Proto": "https"})
        assert r.headers["strict-transport-security"].startswith("max-age=")
        assert "strict-transport-security" not in admin.get(url + "/healthz").headers
