"""Registry protocol 2: a pull's registry steps in two calls, the commit made by the registry,
and a clear error (never a hang) from a registry server that predates it."""

from __future__ import annotations

import time
from typing import Any

import pytest

from recovery.transfer.errors import NoSourceError, RegistryProtocolError
from recovery.transfer.registry import ABORTED, COMMITTED, PUBLISHING, InMemoryRegistry
from recovery.transfer.registry_net import RegistryClient, RegistryServer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_open_and_close_pull_do_what_the_single_calls_did() -> None:
    registry = InMemoryRegistry(clock=Clock())
    registry.begin(name="p", version=1, manifest_digest="d1", publisher="T", lease_s=5)
    registry.begin(name="p", version=2, manifest_digest="d2", publisher="T", lease_s=5, commit_at=2)
    registry.announce(name="p", version=1, address="R", complete=True)
    source, info = registry.open_pull(
        name="p", version=2, receiver="R", exclude=[], relays=True, announce=True, withdraw=1
    )
    assert (source, info.manifest_digest, info.state) == ("T", "d2", PUBLISHING)
    # R no longer serves v1 and serves v2 partially: a second receiver is sent to R (a partial
    # relay is preferred to the publisher at equal load), and nobody to R for v1.
    assert registry.assign_source(name="p", version=1, receiver="X") == "T"
    assert registry.assign_source(name="p", version=2, receiver="Y") == "R"
    # Closing R's complete pull commits v2 at once (commit_at=2: the publisher and R).
    done = registry.close_pull(name="p", version=2, receiver="R", timeout=0)
    assert (done.state, done.complete_sources) == (COMMITTED, 2)


def test_the_registry_commits_only_under_a_live_lease() -> None:
    clock = Clock()
    registry = InMemoryRegistry(clock=clock)
    registry.begin(name="p", version=1, manifest_digest="d", publisher="T", lease_s=5, commit_at=3)
    registry.announce(name="p", version=1, address="A", complete=True)
    assert registry.info(name="p", version=1).state == PUBLISHING  # one replica of two
    clock.now += 6  # the publisher died: its lease lapsed before the second replica came
    with pytest.raises(Exception, match="aborted"):
        registry.announce(name="p", version=1, address="B", complete=True)
    assert registry.info(name="p", version=1).state == ABORTED


def test_open_pull_with_no_source_still_announces() -> None:
    registry = InMemoryRegistry(clock=Clock())
    registry.begin(name="p", version=1, manifest_digest="d", publisher="T", lease_s=5)
    with pytest.raises(NoSourceError):
        registry.open_pull(
            name="p",
            version=1,
            receiver="R",
            exclude=["T"],
            relays=True,
            announce=True,
            withdraw=None,
        )
    assert registry.assign_source(name="p", version=1, receiver="X", exclude=["T"]) == "R"


def test_protocol_two_calls_over_tcp() -> None:
    server = RegistryServer(InMemoryRegistry())
    client = RegistryClient(server.address, timeout=5.0)
    try:
        client.begin(
            name="p", version=1, manifest_digest="d", publisher="T", lease_s=5, commit_at=2
        )
        source, info = client.open_pull(
            name="p", version=1, receiver="R", exclude=(), relays=True, announce=True, withdraw=None
        )
        assert (source, info.manifest_digest) == ("T", "d")
        assert client.close_pull(name="p", version=1, receiver="R", timeout=5.0).state == COMMITTED
    finally:
        client.close()
        server.close()


class ProtocolOneServer(RegistryServer):
    """A registry server as it was before protocol 2: no open_pull/close_pull, no commit_at,
    and no protocol number in its replies."""

    def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        op, kwargs = request.get("op"), request.get("kwargs") or {}
        if op in ("open_pull", "close_pull"):
            return {"ok": False, "error": "TransferConfigError", "detail": f"unknown call {op!r}"}
        if "commit_at" in kwargs:
            return {
                "ok": False,
                "error": "TransferConfigError",
                "detail": "begin() got an unexpected keyword argument 'commit_at'",
            }
        return self._answer(request)


def test_an_older_registry_server_gets_a_clear_error_at_once() -> None:
    server = ProtocolOneServer(InMemoryRegistry())
    client = RegistryClient(server.address, timeout=5.0)
    try:
        started = time.monotonic()
        with pytest.raises(RegistryProtocolError, match="protocol 1.*needs protocol 2.*upgrade"):
            client.begin(
                name="p", version=1, manifest_digest="d", publisher="T", lease_s=5, commit_at=2
            )
        client.begin(name="p", version=1, manifest_digest="d", publisher="T", lease_s=5)
        with pytest.raises(RegistryProtocolError, match="'open_pull'.*upgrade"):
            client.open_pull(
                name="p",
                version=1,
                receiver="R",
                exclude=(),
                relays=True,
                announce=True,
                withdraw=None,
            )
        with pytest.raises(RegistryProtocolError, match="'close_pull'.*upgrade"):
            client.close_pull(name="p", version=1, receiver="R", timeout=30.0)
        assert time.monotonic() - started < 5.0  # answered, not waited out
        # Protocol-1 calls still work against it, and an ordinary refusal stays what it was.
        assert client.assign_source(name="p", version=1, receiver="R") == "T"
        with pytest.raises(NoSourceError):
            client.assign_source(name="p", version=1, receiver="Q", exclude=["T", "R"])
    finally:
        client.close()
        server.close()
