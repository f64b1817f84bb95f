"""Which connection makes room for a new one (app.core.client_connections)."""

from __future__ import annotations

import ipaddress

import pytest

from app.core.client_connections import ClientConnections, client_key


class Conn:
    """A connection as the table sees it: waiting for a request or busy with one."""

    def __init__(self, name: str, *, busy: bool = False) -> None:
        self.name, self.busy, self.closed = name, busy, False

    def waiting_for_request(self) -> bool:
        return not self.busy and not self.closed

    def make_room(self) -> None:
        self.closed = True

    def __repr__(self) -> str:
        return self.name


def test_an_address_at_its_cap_loses_its_oldest_waiting_connection() -> None:
    table = ClientConnections(per_client=3, total=100)
    a = [Conn(f"a{i}", busy=(i == 0)) for i in range(3)]
    for c in a:
        assert table.admit(c, "10.0.0.1")
    other = Conn("b0")
    assert table.admit(other, "10.0.0.2")
    newer = Conn("a3")
    assert table.admit(newer, "10.0.0.1")
    # a0 is busy with a request: a1, the oldest waiting one, went; nobody else's did.
    assert [c.closed for c in a] == [False, True, False] and not other.closed
    assert table.of_client("10.0.0.1") == 3 and len(table) == 4 and table.made_room == 1


def test_a_new_connection_is_refused_when_all_of_its_address_are_busy() -> None:
    table = ClientConnections(per_client=2, total=100)
    busy = [Conn("a0", busy=True), Conn("a1", busy=True)]
    for c in busy:
        assert table.admit(c, "10.0.0.1")
    assert not table.admit(Conn("a2"), "10.0.0.1")
    assert table.refused == 1 and table.of_client("10.0.0.1") == 2
    assert table.admit(Conn("b0"), "10.0.0.2")  # another address is not affected
    table.forget(busy[0])  # one finished and closed: room again
    assert table.admit(Conn("a3"), "10.0.0.1")


def test_near_the_total_the_oldest_waiting_connection_anywhere_makes_room() -> None:
    table = ClientConnections(per_client=100, total=4)
    conns = [Conn("busy", busy=True), Conn("w1"), Conn("w2")]
    for i, c in enumerate(conns):
        assert table.admit(c, f"10.0.0.{i}")
    # a 4th would reach uvicorn's limit (it answers 503 at the limit): w1 makes room
    assert table.admit(Conn("new"), "10.0.0.9")
    assert [c.closed for c in conns] == [False, True, False] and len(table) == 3


def test_trusted_proxies_and_unix_sockets_are_not_capped() -> None:
    table = ClientConnections(
        per_client=1, total=100, uncapped=[ipaddress.ip_network("172.28.0.0/24")]
    )
    proxied = [Conn(f"p{i}", busy=True) for i in range(5)]
    assert all(table.admit(c, "172.28.0.7") for c in proxied)
    assert all(table.admit(Conn(f"u{i}", busy=True), None) for i in range(5))
    assert table.admit(Conn("x0", busy=True), "172.28.1.7")
    assert not table.admit(Conn("x1", busy=True), "172.28.1.7")  # outside the network


def test_ipv6_clients_count_per_64_and_mapped_ipv4_as_ipv4() -> None:
    assert client_key("2001:db8:1:2:aaaa::1") == client_key("2001:db8:1:2:bbbb::9")
    assert client_key("2001:db8:1:2::1") == "2001:db8:1:2::/64"
    assert client_key("2001:db8:1:3::1") != client_key("2001:db8:1:2::1")
    assert client_key("::ffff:192.0.2.1") == "192.0.2.1"
    assert client_key("192.0.2.1") == "192.0.2.1"


def test_forget_is_idempotent_and_limits_are_checked() -> None:
    table = ClientConnections(per_client=1, total=10)
    c = Conn("a")
    table.admit(c, "10.0.0.1")
    table.forget(c)
    table.forget(c)
    assert len(table) == 0 and table.of_client("10.0.0.1") == 0
    with pytest.raises(ValueError, match="per_client"):
        ClientConnections(per_client=0, total=10)
