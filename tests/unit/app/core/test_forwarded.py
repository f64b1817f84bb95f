"""Which peer's X-Forwarded-For / -Proto are believed (app.core.forwarded)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.core.forwarded import TrustedProxyMiddleware, parse_trusted_proxies


def seen_by_app(trusted: list[str], peer: str, headers: dict[str, str]) -> tuple[str, str]:
    """(client address, scheme) as the app behind the middleware sees them."""
    seen: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.update(client=scope["client"][0], scheme=scope["scheme"])

    scope = {
        "type": "http",
        "scheme": "http",
        "client": (peer, 40000),
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    middleware = TrustedProxyMiddleware(app, trusted=parse_trusted_proxies(trusted))
    asyncio.run(middleware(scope, None, None))  # type: ignore[arg-type]
    return seen["client"], seen["scheme"]


XFF = {"X-Forwarded-For": "198.51.100.7", "X-Forwarded-Proto": "https"}


def test_nothing_is_trusted_by_default_not_even_loopback() -> None:
    assert seen_by_app([], "127.0.0.1", XFF) == ("127.0.0.1", "http")


def test_a_trusted_proxy_names_the_client_and_the_scheme() -> None:
    assert seen_by_app(["127.0.0.1"], "127.0.0.1", XFF) == ("198.51.100.7", "https")
    assert seen_by_app(["10.0.0.0/8"], "10.9.8.7", XFF) == ("198.51.100.7", "https")
    assert seen_by_app(["10.0.0.0/8"], "11.0.0.1", XFF) == ("11.0.0.1", "http")


def test_the_rightmost_untrusted_address_is_the_client() -> None:
    chain = {"X-Forwarded-For": "6.6.6.6, 198.51.100.7, 10.0.0.2"}
    assert seen_by_app(["10.0.0.0/8"], "10.0.0.1", chain)[0] == "198.51.100.7"
    # Two headers are one list, in order.
    split = {"X-Forwarded-For": "6.6.6.6", "x-forwarded-for": "198.51.100.7"}
    assert seen_by_app(["10.0.0.1"], "10.0.0.1", split)[0] == "198.51.100.7"


def test_only_http_and_https_are_taken_as_the_scheme() -> None:
    odd = {"X-Forwarded-Proto": "javascript"}
    assert seen_by_app(["127.0.0.1"], "127.0.0.1", odd) == ("127.0.0.1", "http")


@pytest.mark.parametrize("bad", ["proxy.local", "10.0.0.300", "10.0.0.0/33", ""])
def test_a_bad_proxy_value_is_named(bad: str) -> None:
    with pytest.raises(ValueError, match=repr(bad).replace("[", r"\[")):
        parse_trusted_proxies([bad])
