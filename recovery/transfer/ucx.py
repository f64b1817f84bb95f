"""The ``ucx`` transport (the ``ucx`` extra: ``ucxx``): RDMA where the fabric has it, TCP otherwise.

ucxx is asyncio-based; the rest of the library is synchronous threads. The transport therefore
runs one event loop in a daemon thread, submits every call (one or a few messages, or a whole
chunk stream) to it, and waits on the result until no message of the call has completed for the
caller's timeout. Then the endpoint is aborted, which cancels the UCX request; the coroutine is
never cancelled from outside, since ucxx then frees buffers UCX may still write into (a
connect's handshake is left to finish and its endpoint aborted late).
Each protocol message is one ucxx tag message of exactly the size the receiver posts, which the
framing in :mod:`recovery.transfer.wire` guarantees.

``TCP_CM_REUSEADDR=y`` is passed to UCX so a listener restarted on the same port after a crash
can bind again (the TCP connection manager otherwise refuses while the old socket lingers).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any, ClassVar, TypeVar

from recovery.transfer.errors import PeerDeadError, TransferTimeout, TransportUnavailableError
from recovery.transfer.transport import ConnectionHandler, Transport, split_address

log = logging.getLogger("rlguard.recovery.transfer.ucx")

# TCP_CM_REUSEADDR: a restarted listener can rebind its port. The TCP segment sizes: UCX's
# default of 8 KiB moved a 1 GiB weight set over loopback at 0.39 GB/s; 1 MiB segments at
# 1.00 GB/s (benchmarks/transfer.py --parts ucx on the 2-core test VM; raw TCP 3.8 GB/s).
UCX_OPTIONS: dict[str, str] = {
    "TCP_CM_REUSEADDR": "y",
    "TCP_TX_SEG_SIZE": "1m",
    "TCP_RX_SEG_SIZE": "1m",
}
_INIT_LOCK = threading.Lock()
_LOOP: asyncio.AbstractEventLoop | None = None


ABORT_PERIOD_NS = 10**9
# Bodies a stream receive keeps posted ahead of the one it reports next (each is the caller's
# own buffer, so posting ahead allocates nothing).
RECEIVES_AHEAD = 8
_STREAM_END = object()
_T = TypeVar("_T")


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Done-callback of a send or receive left behind by a failed call: its error is not news
    (the call's first error is the one raised), so asyncio need not log it."""
    if not future.cancelled():
        future.exception()


def _ucx_error() -> type[BaseException]:
    errors: type[BaseException] = importlib.import_module("ucxx.exceptions").UCXError
    return errors


def load_ucxx() -> ModuleType:
    """Import ``ucxx`` or raise :class:`TransportUnavailableError` saying how to get it."""
    try:
        return importlib.import_module("ucxx")
    except ImportError as exc:
        raise TransportUnavailableError(
            "the ucx transport needs the 'ucx' extra (pip install 'rlguard[ucx]', which installs "
            f"ucxx); it is not importable here: {exc}"
        ) from exc


def _event_loop(ucxx: ModuleType, options: Mapping[str, str]) -> asyncio.AbstractEventLoop:
    """The process-wide loop that drives ucxx (UCX is initialised once per process)."""
    global _LOOP
    with _INIT_LOCK:
        if _LOOP is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="ucx-loop", daemon=True).start()

            async def init() -> None:
                # UCX progresses in ucxx's own thread; a completed request is announced through
                # a Python future (ucxx's notifier thread). Without that future (ucxx's default)
                # every wait polls its request from this loop with ``asyncio.sleep(0)``: the
                # loop spins holding the GIL and the threads that verify and hand over chunks
                # wait for it (benchmarks/transfer.py --parts ucx, 512 MiB: 0.46-0.59 GB/s at
                # 1.7 CPU s/GiB spinning, 1.35 GB/s at 0.56 with the future).
                ucxx.init(options=dict(options), progress_mode="thread", enable_python_future=True)

            asyncio.run_coroutine_threadsafe(init(), loop).result(timeout=30)
            _LOOP = loop
        return _LOOP


class UcxChannel:
    """One ucxx endpoint used synchronously; every call fails when no message of it completes
    within its ``timeout``."""

    def __init__(
        self, endpoint: Any, loop: asyncio.AbstractEventLoop, peer: str, ucxx: ModuleType
    ) -> None:
        self.endpoint = endpoint
        self.peer = peer
        self._loop = loop
        self._errors: tuple[type[BaseException], ...] = (_ucx_error(),)
        # When a message of the call in progress last completed (set on the loop thread).
        self._moved_at = 0.0

    def _wait(self, coro: Coroutine[Any, Any, Any], timeout: float, what: str) -> None:
        self._moved_at = time.monotonic()
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            self._while_moving(future.result, concurrent.futures.TimeoutError, timeout, what)
        except self._errors as exc:
            raise PeerDeadError(self.peer, f"{what} failed: {exc}") from exc

    def _while_moving(
        self, get: Callable[[float], _T], empty: type[Exception], timeout: float, what: str
    ) -> _T:
        """``get(seconds)`` (raising ``empty`` when nothing came in time) until it returns,
        waiting as long as some message of the call in progress completed within ``timeout``;
        then the endpoint is aborted and TransferTimeout raised."""
        while True:
            try:
                return get(max(0.0, self._moved_at + timeout - time.monotonic()))
            except empty as exc:
                if time.monotonic() < self._moved_at + timeout:
                    continue  # a message completed meanwhile: the call is still moving
                # Not future.cancel(): aborting the endpoint cancels the UCX request itself,
                # which ends the coroutine; cancelling the coroutine instead would drop ucxx's
                # request object while UCX may still complete it (see UcxTransport.connect).
                self.close()
                raise TransferTimeout(self.peer, f"{what} made no progress for {timeout}s") from exc

    def send(self, data: bytes | memoryview, *, timeout: float) -> None:
        """Send ``data`` as one message."""
        self._wait(self.endpoint.send(data), timeout, "send")

    def send_parts(self, parts: Sequence[bytes | memoryview], *, timeout: float) -> None:
        """Send each part as one message, in order, in one hand-off to the loop; ``timeout``
        bounds the wait for each message."""
        endpoint = self.endpoint

        async def send_all() -> None:
            # Every part is posted at once (UCX keeps the tag messages of one endpoint in
            # order), so the next is on its way while the receiver takes this one.
            sends = [asyncio.ensure_future(endpoint.send(part)) for part in parts]
            try:
                for send in sends:
                    await send
                    self._moved_at = time.monotonic()
            finally:
                for send in sends:
                    send.add_done_callback(_retrieved)

        self._wait(send_all(), timeout, "send")

    def recv_into(self, buffer: memoryview, *, timeout: float) -> None:
        """Receive one message of exactly ``len(buffer)`` bytes into ``buffer``."""
        self._wait(self.endpoint.recv(buffer), timeout, "receive")

    def recv_each(
        self,
        heads: Sequence[memoryview],
        body_for: Callable[[int, memoryview], memoryview | None],
        *,
        timeout: float,
    ) -> Iterator[int]:
        """Receive items in order (a head, then the buffer ``body_for(i, head)`` names, run on
        the loop thread), yielding ``i`` once item ``i`` has landed; one hand-off to the loop
        for the whole stream. Receives are posted ahead: a head as soon as the previous item's
        body is posted, up to ``RECEIVES_AHEAD`` bodies, so the sender's next message finds its
        receive waiting instead of a round trip through this thread."""
        landed: queue.SimpleQueue[int | object] = queue.SimpleQueue()
        self._moved_at = time.monotonic()
        future = asyncio.run_coroutine_threadsafe(
            self._receive_stream(heads, body_for, landed), self._loop
        )
        try:
            while True:
                item = self._while_moving(
                    lambda seconds: landed.get(timeout=seconds), queue.Empty, timeout, "receive"
                )
                if item is _STREAM_END:
                    break
                assert isinstance(item, int)
                yield item
            try:
                future.result()
            except self._errors as exc:
                raise PeerDeadError(self.peer, f"receive failed: {exc}") from exc
        finally:
            if not future.done():
                self.close()  # abandoned mid-stream: its posted receives are cancelled

    async def _receive_stream(
        self,
        heads: Sequence[memoryview],
        body_for: Callable[[int, memoryview], memoryview | None],
        landed: queue.SimpleQueue[int | object],
    ) -> None:
        """The loop side of :meth:`recv_each`: puts each landed index, then ``_STREAM_END``."""
        endpoint = self.endpoint
        bodies: deque[tuple[int, asyncio.Future[Any] | None]] = deque()  # posted, not reported
        head: asyncio.Future[Any] | None = None
        posted = 0  # heads posted so far
        try:
            while True:
                if head is None and posted < len(heads) and len(bodies) < RECEIVES_AHEAD:
                    head = asyncio.ensure_future(endpoint.recv(heads[posted]))
                    posted += 1
                waits = [f for f in (head, bodies[0][1] if bodies else None) if f is not None]
                if not waits:
                    return
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                self._moved_at = time.monotonic()
                if head is not None and head.done():
                    head.result()
                    head = None
                    i = posted - 1
                    body = body_for(i, heads[i])
                    bodies.append(
                        (i, None if body is None else asyncio.ensure_future(endpoint.recv(body)))
                    )
                while bodies and (bodies[0][1] is None or bodies[0][1].done()):
                    i, received = bodies.popleft()
                    if received is not None:
                        received.result()
                    landed.put(i)
        except BaseException:
            # Bodies already posted belong to heads that arrived, so the sender sent them too
            # (before what failed, e.g. a head refused by ``body_for``): they land and are
            # reported before the error. After a failed receive the endpoint has failed: the
            # rest fail with it, or when the caller's timeout or session closes the channel.
            while bodies:
                i, received = bodies[0]
                if received is not None:
                    try:
                        await received
                    except BaseException:  # noqa: BLE001 - the first error is the one raised
                        break
                landed.put(i)
                bodies.popleft()
            for received in [head, *(r for _i, r in bodies)]:
                if received is not None:
                    received.add_done_callback(_retrieved)
            raise
        finally:
            landed.put(_STREAM_END)

    def close(self) -> None:
        """Abort the endpoint (idempotent; a clean close would wait on the peer)."""
        if not self.endpoint.closed:
            # abort() blocks for at most ``period`` ns; run it on the loop thread, which owns
            # the endpoint, so it never races an in-flight request's completion.
            self._loop.call_soon_threadsafe(self.endpoint.abort, ABORT_PERIOD_NS)


class UcxListener:
    """A ucxx listener whose connections are handled by blocking handlers in worker threads."""

    def __init__(
        self,
        ucxx: ModuleType,
        loop: asyncio.AbstractEventLoop,
        host: str,
        port: int,
        handler: ConnectionHandler,
    ) -> None:
        self._loop = loop

        async def on_connect(endpoint: Any) -> None:
            channel = UcxChannel(endpoint, loop, f"ucx-peer-{id(endpoint):x}", ucxx)
            try:
                await loop.run_in_executor(None, handler, channel)
            finally:
                channel.close()

        async def create() -> Any:
            return ucxx.create_listener(on_connect, port=port or None)

        self._listener = asyncio.run_coroutine_threadsafe(create(), loop).result(timeout=30)
        self.address = f"{host}:{self._listener.port}"

    def close(self) -> None:
        """Stop listening."""

        async def close() -> None:
            self._listener.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=30)


class UcxTransport(Transport):
    """Point-to-point transfer over UCX; ``options`` are extra UCX settings (no ``UCX_`` prefix)."""

    name: ClassVar[str] = "ucx"
    stream_oriented: ClassVar[bool] = False

    def __init__(self, *, options: Mapping[str, str] | None = None) -> None:
        self._ucxx = load_ucxx()
        self._loop = _event_loop(self._ucxx, {**UCX_OPTIONS, **(options or {})})

    def listen(self, host: str, port: int, handler: ConnectionHandler) -> UcxListener:
        """Listen on ``port`` (0 = a free one); peers reach it at ``host:port``."""
        return UcxListener(self._ucxx, self._loop, host, port, handler)

    def connect(self, address: str, *, timeout: float) -> UcxChannel:
        """Open an endpoint to ``address`` within ``timeout``."""
        host, port = split_address(address)
        ucxx = self._ucxx

        async def create() -> Any:
            # No connect_timeout: ucxx's own timeout abandons the handshake just like a cancel
            # would (see below); ours is the wait on the future.
            return await ucxx.create_endpoint(host, port, connect_timeout=None)

        future = asyncio.run_coroutine_threadsafe(create(), self._loop)
        try:
            endpoint = future.result(timeout=timeout)
        except concurrent.futures.TimeoutError as exc:
            # Never cancel a handshake in flight: ucxx frees the buffer its posted stream_recv
            # writes the peer's reply into, UCX writes it anyway once the peer answers, and the
            # heap is corrupt (SIGSEGV in unrelated code a moment later; reproduced by connecting
            # to a SIGSTOPped peer a few times, then SIGCONT). The handshake ends when the peer
            # answers (the endpoint is then aborted) or dies (UCX reports an error).
            future.add_done_callback(_abort_late_endpoint)
            raise TransferTimeout(address, f"ucx connect took longer than {timeout}s") from exc
        except _ucx_error() as exc:
            raise PeerDeadError(address, f"ucx connect failed: {exc}") from exc
        return UcxChannel(endpoint, self._loop, address, ucxx)


def _abort_late_endpoint(future: concurrent.futures.Future[Any]) -> None:
    """Done-callback (on the loop thread) of a connect whose caller timed out."""
    if not future.cancelled() and future.exception() is None:
        future.result().abort(ABORT_PERIOD_NS)
