"""Login limits behind a reverse proxy (issue 17 item 3).

The in-process apps here see every request from 127.0.0.1 (httpx's ASGI transport), which plays
the proxy: with ``trusted_proxies=["127.0.0.1"]`` its ``X-Forwarded-For`` names the client, by
default it is ignored. test_reference_proxy.py runs a real ``rlguard server`` behind nginx.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from app.core.config import HardeningSettings
from app.models import Role
from tests.harness import (
    Api,
    auth,
)
from tests.harness.dashboard import PASSWORD
from tests.integration.auth._browser import Browser, add_user

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ATTACKER, ADMIN_ADDR = "203.0.113.9", "198.51.100.7"
LIMITS = HardeningSettings(
    login_attempts_per_minute=6,
    login_burst=3,
    login_attempts_per_name_per_minute=6,
    login_name_burst=5,
)


@pytest.fixture
def auth_db_url(sqlite_url: str) -> str:
    # Limits live in each process: which database the app uses does not matter here.
    return sqlite_url


def login(api: Api, name: str, password: str, forwarded_for: str | None = None) -> int:
    headers = {"X-Forwarded-For": forwarded_for} if forwarded_for else {}
    r = api.client.post(
        "/api/v1/auth/token", json={"name": name, "password": password}, headers=headers
    )
    if r.status_code == 429:
        assert int(r.headers["retry-after"]) >= 1 and "too many login attempts" in r.text
    return r.status_code


def test_an_attacker_locked_out_does_not_lock_out_the_admin_from_another_address(
    make_replica: Callable[..., Api],
) -> None:
    api = make_replica(hardening=LIMITS, trusted_proxies=["127.0.0.1"])
    add_user(api, "root", Role.admin)
    codes = [login(api, "root", "guess", ATTACKER) for _ in range(4)]
    assert codes == [401, 401, 401, 429]
    # The attacker's address is locked, even with the right password ...
    assert login(api, "root", PASSWORD, ATTACKER) == 429
    # ... the admin elsewhere is not (the name's own budget has room left).
    assert login(api, "root", PASSWORD, ADMIN_ADDR) == 201
    # The dashboard's form shares both budgets.
    browser = Browser(api)
    r = browser.login("root")  # from the proxy itself: its own address, its own bucket
    assert r.status_code == 303


def test_many_addresses_guessing_one_name_are_limited_per_name(
    make_replica: Callable[..., Api],
) -> None:
    api = make_replica(hardening=LIMITS, trusted_proxies=["127.0.0.1"])
    add_user(api, "root", Role.admin)
    add_user(api, "lena", Role.viewer)
    codes = [login(api, "lena", "guess", f"192.0.2.{i}") for i in range(1, 7)]
    # The name's budget (5) is spent; the 6th address had no failure yet: one guess, then out.
    assert codes == [401] * 6
    assert login(api, "lena", "guess", "192.0.2.6") == 429
    # An address that failed for the name is refused even with the right password...
    assert login(api, "lena", PASSWORD, "192.0.2.1") == 429
    # ...one with no failure signs in (the user, from their own machine), and other names
    # are not touched.
    assert login(api, "lena", PASSWORD, "192.0.2.50") == 201
    assert login(api, "root", PASSWORD, "192.0.2.51") == 201
    # The dashboard's form shares the name's budget: the page says why, with Retry-After.
    browser = Browser(api)  # from the proxy itself, 127.0.0.1
    assert browser.login("lena", "guess").status_code == 401
    page = browser.login("lena")
    assert page.status_code == 429 and int(page.headers["retry-after"]) >= 1
    assert "too many login attempts for this user name" in page.text


def test_thirty_wrong_guesses_from_elsewhere_do_not_lock_the_admin_out(
    make_replica: Callable[..., Api],
) -> None:
    """Issue 41 item 6, with the shipped budget per name (30; refilled slowly here, so that
    the machine's speed at hashing 30 passwords does not matter): 30 wrong guesses for
    ``root`` from 30 other addresses spend it, and the real admin still signs in, by the API
    and by the dashboard's form; a guesser's address stays refused."""
    burst = HardeningSettings().login_name_burst
    assert burst == 30
    slow_refill = HardeningSettings(login_attempts_per_name_per_minute=0.01)
    api = make_replica(hardening=slow_refill, trusted_proxies=["127.0.0.1"])
    add_user(api, "root", Role.admin)
    codes = [login(api, "root", f"guess-{i}", f"203.0.113.{i}") for i in range(1, burst + 1)]
    assert codes == [401] * burst
    assert login(api, "root", "guess-again", "203.0.113.1") == 429
    assert login(api, "root", PASSWORD, "203.0.113.2") == 429
    assert login(api, "root", PASSWORD, ADMIN_ADDR) == 201
    assert Browser(api).login("root").status_code == 303


def test_forwarded_for_from_an_untrusted_peer_is_ignored(
    make_replica: Callable[..., Api],
) -> None:
    api = make_replica(hardening=LIMITS)  # no trusted proxy: 127.0.0.1 is not one by default
    add_user(api, "root", Role.admin)
    codes = [login(api, "root", "guess", f"192.0.2.{i}") for i in range(1, 5)]
    assert codes == [401, 401, 401, 429]  # one client (127.0.0.1), whatever it claims


def test_only_the_rightmost_untrusted_forwarded_address_counts(
    make_replica: Callable[..., Api],
) -> None:
    api = make_replica(hardening=LIMITS, trusted_proxies=["127.0.0.1", "10.0.0.0/8"])
    add_user(api, "root", Role.admin)
    # The client writes anything on the left; the proxies (trusted) append what they saw.
    codes = [login(api, "root", "guess", f"192.0.2.{i}, {ATTACKER}, 10.1.2.3") for i in range(1, 5)]
    assert codes == [401, 401, 401, 429]
    assert login(api, "root", PASSWORD, f"{ATTACKER}, {ADMIN_ADDR}") == 201


def test_hsts_and_host_cookies_only_when_a_trusted_proxy_says_https(
    make_replica: Callable[..., Api],
) -> None:
    trusting, default = make_replica(trusted_proxies=["127.0.0.1"]), make_replica()
    https = {"X-Forwarded-Proto": "https"}
    r = trusting.client.get("/healthz", headers=https)
    assert r.headers["strict-transport-security"].startswith("max-age=")
    assert "strict-transport-security" not in default.client.get("/healthz", headers=https).headers
    assert "strict-transport-security" not in trusting.client.get("/healthz").headers
    form = trusting.client.get("/login", headers=https)
    assert any(c.startswith("__Host-rlguard_csrf=") for c in form.headers.get_list("set-cookie"))
    form = default.client.get("/login", headers=https)
    assert any(c.startswith("rlguard_csrf=") for c in form.headers.get_list("set-cookie"))


def test_bad_trusted_proxy_is_refused_by_name(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from app.cli import cli

    result = CliRunner().invoke(cli, ["server", "--trusted-proxy", "proxy.local"])
    assert result.exit_code == 2
    assert "'proxy.local'" in result.output and "--trusted-proxy" in result.output


def test_auth_header_is_kept_for_token_users(make_replica: Callable[..., Api]) -> None:
    # The middleware rewrites only the client and scheme: authenticated calls go on working.
    api = make_replica(trusted_proxies=["127.0.0.1"])
    token = add_user(api, "root", Role.admin)
    r = api.client.get("/api/v1/me", headers={**auth(token), "X-Forwarded-For": ATTACKER})
    assert r.status_code == 200
