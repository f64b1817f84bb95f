from __future__ import annotations

import socket
import threading
import time

import pytest
import torch

from recovery.transfer.errors import (
    PeerDeadError,
    ProtocolError,
    TransferConfigError,
    TransferTimeout,
)
from recovery.transfer.manifest import build_manifest
from recovery.transfer.ratelimit import EgressLimiter
from recovery.transfer.store import Buffers, ServedVersion, WeightStore
from recovery.transfer.tcp import TcpChannel
from recovery.transfer.transport import split_address
from recovery.transfer.wire import MAX_MESSAGE_BYTES, recv_message, send_message


@pytest.fixture
def pair() -> tuple[TcpChannel, TcpChannel]:
    a, b = socket.socketpair()
    left, right = TcpChannel(a, "left"), TcpChannel(b, "right")
    yield left, right
    left.close()
    right.close()


def test_messages_round_trip(pair: tuple[TcpChannel, TcpChannel]) -> None:
    left, right = pair
    send_message(left, {"op": "manifest", "version": 3}, timeout=1)
    assert recv_message(right, timeout=1) == {"op": "manifest", "version": 3}


def test_oversized_and_non_object_messages_are_protocol_errors(
    pair: tuple[TcpChannel, TcpChannel],
) -> None:
    left, right = pair
    left.send((MAX_MESSAGE_BYTES + 1).to_bytes(8, "big"), timeout=1)
    with pytest.raises(ProtocolError, match="announced"):
        recv_message(right, timeout=1)
    left.send((2).to_bytes(8, "big") + b"[]", timeout=1)
    with pytest.raises(ProtocolError, match="JSON list"):
        recv_message(right, timeout=1)


def test_silent_peer_times_out_and_closed_peer_is_dead(pair: tuple[TcpChannel, TcpChannel]) -> None:
    left, right = pair
    started = time.monotonic()
    with pytest.raises(TransferTimeout, match="no data for 0.2s"):
        recv_message(right, timeout=0.2)
    assert time.monotonic() - started < 1
    left.send(b"\x00\x00", timeout=1)
    left.close()
    with pytest.raises(PeerDeadError, match="closed after 2/8 bytes"):
        recv_message(right, timeout=1)


def served_version() -> ServedVersion:
    tensors = {"w": torch.arange(64, dtype=torch.float32)}
    return ServedVersion(
        build_manifest("p", 1, tensors, chunk_bytes=64), Buffers(tensors), complete=False
    )


def test_partial_version_serves_a_chunk_once_it_is_marked_ready() -> None:
    served = served_version()
    assert served.wait_ready(1, timeout=0.05) == "timeout"
    threading.Timer(0.05, served.mark_ready, args=(1,)).start()
    assert served.wait_ready(1, timeout=2) == "ready"
    threading.Timer(0.05, served.drop).start()
    assert served.wait_ready(2, timeout=2) == "dropped"


def test_store_waits_for_an_expected_version_and_forgets_removed_ones() -> None:
    store = WeightStore()
    assert store.wait_for("p", 1, timeout=0.01) is None  # not expected: no wait
    store.expect("p", 1)
    served = served_version()
    threading.Timer(0.05, store.add, args=(served,)).start()
    assert store.wait_for("p", 1, timeout=2) is served
    with pytest.raises(KeyError):
        store.add(served)
    assert store.stats() == {"p@1": {"state": "partial", "served_chunks": 0}}
    store.remove("p", 1)
    assert served.state == "dropped" and store.get("p", 1) is None


def test_egress_limiter_spaces_reservations_at_the_rate() -> None:
    limiter = EgressLimiter(1000.0)
    delays = [limiter.reserve(100) for _ in range(5)]
    assert delays[0] == pytest.approx(0, abs=0.01)
    assert delays[4] == pytest.approx(0.4, abs=0.02)
    with pytest.raises(TransferConfigError, match="bytes_per_s"):
        EgressLimiter(0)


@pytest.mark.parametrize("bad", ["nohost", "host:", ":80", "h:99999", "h:x1"])
def test_bad_addresses_are_named(bad: str) -> None:
    with pytest.raises(TransferConfigError, match=repr(bad).replace("[", r"\[")):
        split_address(bad)
    assert split_address("[::1]:80") == ("::1", 80)
