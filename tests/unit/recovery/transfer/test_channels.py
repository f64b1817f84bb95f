"""The channel calls that move heads and their bodies in one call (``send_parts``, ``recv_each``),
on a byte stream (tcp, a socket pair) and on a message transport (ucx, a real ucxx endpoint pair
over loopback in this process)."""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from recovery.transfer import make_transport
from recovery.transfer.errors import ProtocolError, TransferTimeout
from recovery.transfer.tcp import TcpChannel
from recovery.transfer.wire import Channel

PAYLOAD = bytes(range(256)) * 4096  # 1 MiB


@pytest.fixture(params=["tcp", "ucx"])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[Channel, Channel]]:
    if request.param == "tcp":
        a, b = socket.socketpair()
        left, right = TcpChannel(a, "left"), TcpChannel(b, "right")
        yield left, right
        left.close()
        right.close()
        return
    transport = make_transport("ucx")
    accepted: queue.Queue[Channel] = queue.Queue()
    done = queue.Queue[None]()

    def handler(channel: Channel) -> None:
        accepted.put(channel)
        done.get()  # the handler's return closes the channel: keep it open for the test

    listener = transport.listen("127.0.0.1", 0, handler)
    sender = transport.connect(listener.address, timeout=10)
    receiver = accepted.get(timeout=10)
    yield sender, receiver
    sender.close()
    done.put(None)
    listener.close()


def in_background(send: Callable[[], None]) -> Callable[[], None]:
    """Run ``send`` in a thread (a large send waits for the receiver); the returned call waits
    for it and raises what it raised."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            send()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join() -> None:
        thread.join(20)
        assert not thread.is_alive(), "the send never finished"
        if failed:
            raise failed[0]

    return join


def assert_next_message_arrives_whole(left: Channel, right: Channel) -> None:
    """Nothing was left posted or half-read by the call before: the next message lands whole."""
    left.send(b"next", timeout=10)
    after = memoryview(bytearray(4))
    right.recv_into(after, timeout=10)
    assert bytes(after) == b"next"


def test_a_head_and_its_body_arrive_in_one_call_each_side(pair: tuple[Channel, Channel]) -> None:
    left, right = pair

    def send() -> None:
        left.send_parts((b"HEAD", memoryview(PAYLOAD)), timeout=10)
        left.send(b"next", timeout=10)

    sent = in_background(send)
    head = memoryview(bytearray(4))
    body = memoryview(bytearray(len(PAYLOAD)))
    seen: list[bytes] = []

    def body_for(i: int, h: memoryview) -> memoryview:
        seen.append(bytes(h))  # the head has landed before the body's buffer is chosen
        return body

    assert list(right.recv_each([head], body_for, timeout=10)) == [0]
    assert seen == [b"HEAD"] and bytes(body) == PAYLOAD
    after = memoryview(bytearray(4))
    right.recv_into(after, timeout=10)
    assert bytes(after) == b"next"
    sent()


def test_no_body_is_received_when_the_head_announces_none(pair: tuple[Channel, Channel]) -> None:
    left, right = pair
    left.send_parts((b"NONE",), timeout=10)
    left.send(b"more", timeout=10)
    head = memoryview(bytearray(4))
    assert list(right.recv_each([head], lambda i, h: None, timeout=10)) == [0]
    assert bytes(head) == b"NONE"
    after = memoryview(bytearray(4))
    right.recv_into(after, timeout=10)
    assert bytes(after) == b"more"  # the next message was left for the next call


def test_what_the_body_choice_raises_is_raised_to_the_caller_and_nothing_more_is_received(
    pair: tuple[Channel, Channel],
) -> None:
    left, right = pair
    left.send(b"BAD!", timeout=10)
    head = memoryview(bytearray(4))

    def body_for(i: int, h: memoryview) -> memoryview:
        raise ProtocolError(f"refused head {bytes(h)!r}")

    with pytest.raises(ProtocolError, match="refused head b'BAD!'"):
        list(right.recv_each([head], body_for, timeout=10))
    # No receive was posted for a body: the next message goes to the next call whole.
    assert_next_message_arrives_whole(left, right)


def test_a_call_of_many_messages_times_out_only_when_one_of_them_makes_no_progress(
    pair: tuple[Channel, Channel],
) -> None:
    # The server sends a few chunks per call: the timeout is a hung peer's, per message, not a
    # bound on the whole call (which on a slow link takes longer than any one message).
    left, right = pair
    parts = [memoryview(PAYLOAD)] * 4
    sent = in_background(lambda: left.send_parts(parts, timeout=0.5))
    started = time.monotonic()
    for _ in parts:
        time.sleep(0.3)
        buffer = memoryview(bytearray(len(PAYLOAD)))
        right.recv_into(buffer, timeout=10)
        assert bytes(buffer) == PAYLOAD
    sent()
    assert time.monotonic() - started > 1.0  # longer than the timeout in all
    # A receiver that takes nothing: the call gives up after about its timeout.
    stalled = in_background(lambda: left.send_parts(parts, timeout=0.5))
    with pytest.raises(TransferTimeout, match="no .*progress for 0.5s"):
        stalled()


def _item(i: int) -> tuple[bytes, bytes]:
    """Head and body of stream item ``i`` (odd items are 64 KiB, even ones 1 MiB)."""
    body = bytes([i]) * (len(PAYLOAD) if i % 2 == 0 else 64 << 10)
    return f"H{i:03d}".encode(), body


def test_a_stream_lands_every_item_in_order_and_leaves_the_next_message(
    pair: tuple[Channel, Channel],
) -> None:
    left, right = pair
    parts: list[bytes | memoryview] = []
    for i in range(6):
        head, body = _item(i)
        parts += [head] if i == 3 else [head, body]  # item 3 has a head only
    sent = in_background(
        lambda: (left.send_parts(parts, timeout=10), left.send(b"next", timeout=10))
    )
    heads = [memoryview(bytearray(4)) for _ in range(6)]
    bodies = {i: memoryview(bytearray(len(_item(i)[1]))) for i in range(6) if i != 3}

    def body_for(i: int, head: memoryview) -> memoryview | None:
        assert bytes(head) == _item(i)[0]  # each head is in its own buffer when it is read
        return bodies.get(i)

    got = []
    for i in right.recv_each(heads, body_for, timeout=10):
        if i in bodies:  # an item is yielded only once its body has landed
            assert bytes(bodies[i]) == _item(i)[1]
        got.append(i)
    assert got == list(range(6))
    after = memoryview(bytearray(4))
    right.recv_into(after, timeout=10)
    assert bytes(after) == b"next"
    sent()


def test_an_item_is_yielded_before_the_sender_has_sent_the_next(
    pair: tuple[Channel, Channel],
) -> None:
    # A relay serves a chunk onwards as soon as it landed: the receiver may not hold an item
    # back until the next one's head arrives. The sender sends item 1 only once item 0 was
    # reported, so holding it back would stall the stream into a timeout.
    left, right = pair
    reported = threading.Event()

    def send() -> None:
        left.send_parts(_item(0), timeout=10)
        assert reported.wait(10), "item 0 was not reported before item 1 was sent"
        left.send_parts(_item(1), timeout=10)

    sent = in_background(send)
    heads = [memoryview(bytearray(4)) for _ in range(2)]
    bodies = [memoryview(bytearray(len(_item(i)[1]))) for i in range(2)]
    for i in right.recv_each(heads, lambda i, h: bodies[i], timeout=5):
        assert bytes(bodies[i]) == _item(i)[1]
        reported.set()
    sent()


def test_a_refused_head_ends_the_stream_after_the_items_before_it(
    pair: tuple[Channel, Channel],
) -> None:
    left, right = pair
    parts = [*_item(0), *_item(1), b"BAD!"]
    sent = in_background(lambda: left.send_parts(parts, timeout=10))
    heads = [memoryview(bytearray(4)) for _ in range(4)]
    bodies = [memoryview(bytearray(len(_item(i)[1]))) for i in range(2)]

    def body_for(i: int, head: memoryview) -> memoryview:
        if bytes(head) == b"BAD!":
            raise ProtocolError(f"refused head {i}")
        return bodies[i]

    got = []
    with pytest.raises(ProtocolError, match="refused head 2"):
        for i in right.recv_each(heads, body_for, timeout=10):
            got.append(i)
    assert got == [0, 1] and [bytes(b) for b in bodies] == [_item(0)[1], _item(1)[1]]
    sent()
    # Nothing was posted past the refused head: the next message reaches the next call whole.
    assert_next_message_arrives_whole(left, right)


def test_a_stream_whose_sender_stalls_times_out_after_the_items_that_landed(
    pair: tuple[Channel, Channel],
) -> None:
    left, right = pair
    left.send_parts(_item(0)[:1], timeout=10)  # item 0 has no body; item 1 never comes
    heads = [memoryview(bytearray(4)) for _ in range(2)]
    got = []
    started = time.monotonic()
    with pytest.raises(TransferTimeout, match="no .*progress for 0.5s|no data for 0.5s"):
        for i in right.recv_each(heads, lambda i, h: None, timeout=0.5):
            got.append(i)
    assert got == [0] and time.monotonic() - started < 5
