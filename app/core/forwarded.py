"""The real client behind a reverse proxy: ``X-Forwarded-For`` / ``-Proto`` from trusted peers only.

A request's peer address is the proxy's when one sits in front; the login rate limit, the audit
log and the HTTPS-only parts (HSTS, ``Secure`` and ``__Host-`` cookies) need the browser's
address and scheme instead. Those headers are anyone's to send, so they are believed only when
the peer is a configured proxy (``RLGUARD_TRUSTED_PROXIES`` / ``--trusted-proxy``); by default no
peer is trusted, not even 127.0.0.1 (a local process could otherwise pose as any address).

The server is started with uvicorn's own proxy-header handling off (it trusts 127.0.0.1 by
default); this middleware is the one place that decides.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_trusted_proxies(values: Iterable[str]) -> list[Network]:
    """Addresses or CIDR networks; raises ValueError naming the first value that is neither."""
    networks: list[Network] = []
    for value in values:
        text = value.strip()
        try:
            networks.append(ipaddress.ip_network(text, strict=False))
        except ValueError:
            raise ValueError(
                f"trusted proxy {value!r} is not an IP address or network (e.g. 10.0.0.5, "
                "172.28.0.0/24)"
            ) from None
    return networks


class TrustedProxyMiddleware:
    """Rewrites the scope's client and scheme from forwarded headers sent by a trusted proxy.

    ``X-Forwarded-For`` is read from the right: each proxy appends the address it saw, so the
    first address that is not itself a trusted proxy is the client. Entries left of it were
    written by the client and are ignored.
    """

    def __init__(self, app: ASGIApp, *, trusted: list[Network]) -> None:
        self.app = app
        self.trusted = trusted

    def _is_trusted(self, host: str) -> bool:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self.trusted)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.trusted:
            client = scope.get("client")
            if client and self._is_trusted(str(client[0])):
                self._apply_forwarded(scope)
        await self.app(scope, receive, send)

    def _apply_forwarded(self, scope: Scope) -> None:
        forwarded_for: list[str] = []
        proto = None
        for name, value in scope.get("headers", ()):
            if name == b"x-forwarded-for":
                forwarded_for.extend(v.strip() for v in value.decode("latin-1").split(","))
            elif name == b"x-forwarded-proto":
                # The trusted proxy sets this header (it does not append): its last value.
                proto = value.decode("latin-1").split(",")[-1].strip().lower()
        for host in reversed([h for h in forwarded_for if h]):
            if not self._is_trusted(host):
                scope["client"] = (host, 0)
                break
        if proto in ("http", "https"):
            scope["scheme"] = proto
