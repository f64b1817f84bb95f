"""Peer processes (publisher, relays) and a registry for the transfer integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from recovery.transfer import make_transport
from recovery.transfer.transport import Transport
from tests.integration.transfer._cluster import Cluster, _transport_or_skip


@pytest.fixture(params=["tcp", "shm", "ucx"])
def transport_name(request: pytest.FixtureRequest) -> str:
    _transport_or_skip(request.param)
    return str(request.param)


@pytest.fixture
def transport(transport_name: str) -> Iterator[Transport]:
    t = make_transport(transport_name)
    yield t
    t.close()


@pytest.fixture
def cluster(transport_name: str) -> Iterator[Cluster]:
    c = Cluster(transport_name)
    yield c
    c.close()
