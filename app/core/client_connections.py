"""Open connections by client address: who must make room when a new one arrives.

A slowloris client opens connections and never finishes a request; 1,200 of them from one
address filled uvicorn's concurrency limit and every request, ``/healthz`` included, was answered
503 until the header deadline closed them, which the attacker renewed at will. Refusing a new
connection once an address holds its share would keep the attacker from growing, but would also
refuse that address's real requests (a health probe, an agent behind the same NAT). So the room
is taken from the connection that is worth the least: an address at ``per_client`` connections,
or the whole server near its ``total``, first loses its **oldest connection that is waiting for a
request** (half-open, or idle between keep-alive requests). A new connection is refused only when
its address has no such connection to give up, i.e. when all of them are busy with requests.

Whoever keeps opening connections thus only ever closes its own oldest ones, while a client that
sends its request at once is served. Addresses listed as trusted proxies are not capped per
address: every client behind a proxy shares its address (the proxy bounds them, docs/deploy.md).
IPv6 clients are counted per /64, the block one subscriber is usually given.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Protocol

from app.core.forwarded import Network


class ClientConnection(Protocol):
    """A server connection as the table sees it (``app.core.http_server``'s protocol)."""

    def waiting_for_request(self) -> bool:
        """True while no request is in progress: before a request's headers are complete,
        and between keep-alive requests."""
        ...

    def make_room(self) -> None:
        """Close this connection at once, to give its slot to a newer one."""
        ...


def client_key(host: str) -> str:
    """The address a connection counts against: the host itself, an IPv6 host's /64."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return host


class ClientConnections:
    """Every open connection, oldest first, in total and per client address."""

    def __init__(self, *, per_client: int, total: int, uncapped: Iterable[Network] = ()) -> None:
        if per_client < 1 or total < 1:
            raise ValueError(f"per_client ({per_client}) and total ({total}) must be >= 1")
        self.per_client = per_client
        self.total = total
        self.uncapped = list(uncapped)
        self._all: dict[ClientConnection, str] = {}  # -> client key; insertion order = age
        self._by_client: dict[str, dict[ClientConnection, None]] = {}
        self.made_room = 0  # connections closed to make room (for tests and the log)
        self.refused = 0

    def __len__(self) -> int:
        return len(self._all)

    def of_client(self, host: str) -> int:
        return len(self._by_client.get(client_key(host), ()))

    def admit(self, conn: ClientConnection, host: str | None) -> bool:
        """Register a new connection from ``host`` (None: not an IP peer, e.g. a Unix socket),
        closing older waiting connections to make room; False when it must be refused."""
        key = client_key(host) if host is not None else None
        if key is not None and not self._is_uncapped(host):
            mine = self._by_client.get(key)
            if mine is not None and len(mine) >= self.per_client:
                if not self._close_oldest_waiting(mine):
                    self.refused += 1
                    return False
        # Keep the total below the limit at which uvicorn answers every request 503.
        if len(self._all) + 1 >= self.total:
            self._close_oldest_waiting(self._all)
        self._all[conn] = key or ""
        if key is not None:
            self._by_client.setdefault(key, {})[conn] = None
        return True

    def forget(self, conn: ClientConnection) -> None:
        key = self._all.pop(conn, None)
        if key is None:
            return
        mine = self._by_client.get(key)
        if mine is not None:
            mine.pop(conn, None)
            if not mine:
                del self._by_client[key]

    def _close_oldest_waiting(self, among: Iterable[ClientConnection]) -> bool:
        for conn in among:
            if conn.waiting_for_request():
                self.forget(conn)
                conn.make_room()
                self.made_room += 1
                return True
        return False

    def _is_uncapped(self, host: str | None) -> bool:
        if not self.uncapped or host is None:
            return False
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self.uncapped)
