"""The registry over TCP, so a publisher and receivers in separate processes share one.

One JSON request and one JSON reply per call. Errors come back by name and are re-raised as the
same typed errors on the client side.

Protocol versions: 1 had one call per registry step (a pull cost seven round trips to the
registry); 2 adds ``open_pull`` and ``close_pull`` (a pull's registry steps in two calls) and
``begin(commit_at=...)`` (the registry commits when the replicas are in, so the commit is not a
round trip through the publisher). A protocol-2 server says so in every reply; a client whose
protocol-2 call is refused by a server that does not is told to upgrade that server (a
:class:`RegistryProtocolError`, at once: nothing waits on a call the server cannot answer).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterable
from typing import Any

from recovery.transfer.errors import (
    NoSourceError,
    PeerDeadError,
    ProtocolError,
    RegistryProtocolError,
    TransferConfigError,
    TransferError,
    UnknownVersionError,
    VersionDiscardedError,
)
from recovery.transfer.registry import SourceRegistry, VersionInfo
from recovery.transfer.tcp import TcpChannel, TcpTransport
from recovery.transfer.wire import recv_message, send_message

log = logging.getLogger("rlguard.recovery.transfer.registry")

#: The registry protocol this module speaks (see the module's doc).
PROTOCOL = 2
_METHODS = frozenset(
    {
        "begin",
        "renew",
        "commit",
        "abort",
        "info",
        "latest_committed",
        "announce",
        "withdraw",
        "report_dead",
        "assign_source",
        "release_source",
        "wait",
        "open_pull",
        "close_pull",
    }
)
_ERRORS: dict[str, type[TransferError]] = {
    cls.__name__: cls
    for cls in (
        NoSourceError,
        UnknownVersionError,
        VersionDiscardedError,
        TransferConfigError,
        RegistryProtocolError,
    )
}


class RegistryServer:
    """Serves ``registry`` on ``host:port`` (0 = a free port) until :meth:`close`."""

    def __init__(
        self,
        registry: SourceRegistry,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        idle_timeout: float = 600.0,
    ) -> None:
        self.registry = registry
        self._idle_timeout = idle_timeout
        self._listener = TcpTransport().listen(host, port, self._handle)
        self.address = self._listener.address

    def close(self) -> None:
        """Stop serving."""
        self._listener.close()

    def _handle(self, channel: Any) -> None:
        while True:
            try:
                request = recv_message(channel, timeout=self._idle_timeout)
            except (PeerDeadError, ProtocolError):
                return
            try:
                send_message(channel, self._call(request), timeout=30.0)
            except PeerDeadError:
                # The caller gave up on its request (its own timeout, or it was killed) before
                # the answer went out: nobody is left to answer, and the call was idempotent.
                return

    def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        return {**self._answer(request), "protocol": PROTOCOL}

    def _answer(self, request: dict[str, Any]) -> dict[str, Any]:
        method, kwargs = request.get("op"), request.get("kwargs")
        if method not in _METHODS or not isinstance(kwargs, dict):
            return {
                "ok": False,
                "error": "TransferConfigError",
                "detail": f"unknown call {method!r}",
            }
        try:
            result = getattr(self.registry, method)(**kwargs)
        except TransferError as exc:
            return {"ok": False, "error": type(exc).__name__, "detail": str(exc)}
        except TypeError as exc:  # wrong keyword arguments: a client bug, answered not crashed
            return {"ok": False, "error": "TransferConfigError", "detail": str(exc)}
        if isinstance(result, VersionInfo):
            result = dataclasses.asdict(result)
        elif method == "open_pull":
            source, info = result
            result = [source, dataclasses.asdict(info)]
        return {"ok": True, "result": result}


class RegistryClient:
    """A :class:`SourceRegistry` whose calls go to a :class:`RegistryServer`; thread-safe."""

    def __init__(self, address: str, *, timeout: float = 10.0) -> None:
        self.address = address
        self.timeout = timeout
        self._lock = threading.Lock()
        self._channel: TcpChannel | None = None
        # A blocking wait goes over a connection of its own, taken from these idle ones (as
        # many as waits ran at once), so that it does not hold up the calls of other threads
        # (a publisher's renewals) meanwhile.
        self._idle_wait_channels: list[TcpChannel] = []

    def close(self) -> None:
        """Close the connections (a wait in progress ends with an error)."""
        with self._lock:
            for channel in [self._channel, *self._idle_wait_channels]:
                if channel is not None:
                    channel.close()
            self._channel = None
            self._idle_wait_channels.clear()

    def _exchange(
        self, channel: TcpChannel | None, request: dict[str, Any], timeout: float
    ) -> tuple[TcpChannel, dict[str, Any]]:
        """Send one request and read its reply on ``channel`` (connected first if None); the
        channel to use next time (None after a failure) and the reply."""
        try:
            if channel is None:
                channel = TcpTransport().connect(self.address, timeout=self.timeout)
            send_message(channel, request, timeout=self.timeout)
            return channel, recv_message(channel, timeout=timeout)
        except TransferError:
            if channel is not None:
                channel.close()
            raise

    def _call(self, op: str, *, needs: int = 1, **kwargs: Any) -> Any:
        with self._lock:
            try:
                self._channel, reply = self._exchange(
                    self._channel, {"op": op, "kwargs": kwargs}, self.timeout
                )
            except TransferError:
                self._channel = None
                raise
        return self._result(reply, op, needs)

    def _result(self, reply: dict[str, Any], op: str, needs: int = 1) -> Any:
        if reply.get("ok"):
            return reply.get("result")
        spoken = reply.get("protocol", 1)
        if needs > 1 and (not isinstance(spoken, int) or spoken < needs):
            raise RegistryProtocolError(
                f"registry {self.address} speaks registry protocol {spoken!r}, and {op!r} as "
                f"called here needs protocol {needs}: upgrade the registry server to this "
                f"RLGuard (it answered: {reply.get('detail')})"
            )
        error = _ERRORS.get(str(reply.get("error")), ProtocolError)
        raise error(f"registry {self.address}: {reply.get('detail')}")

    def _blocking_call(self, op: str, kwargs: dict[str, Any], timeout: float, needs: int) -> Any:
        """A call whose reply may take ``timeout`` more than a call, over a connection of its
        own (see ``_idle_wait_channels``)."""
        with self._lock:
            idle = self._idle_wait_channels.pop() if self._idle_wait_channels else None
        channel, reply = self._exchange(
            idle, {"op": op, "kwargs": kwargs}, self.timeout + max(timeout, 0.0)
        )
        with self._lock:
            self._idle_wait_channels.append(channel)
        return self._result(reply, op, needs)

    def begin(
        self,
        *,
        name: str,
        version: int,
        manifest_digest: str,
        publisher: str,
        lease_s: float,
        commit_at: int | None = None,
    ) -> None:
        """See :meth:`SourceRegistry.begin` (``commit_at`` needs protocol 2)."""
        extra = {} if commit_at is None else {"commit_at": commit_at}
        self._call(
            "begin",
            needs=1 if commit_at is None else 2,
            name=name,
            version=version,
            manifest_digest=manifest_digest,
            publisher=publisher,
            lease_s=lease_s,
            **extra,
        )

    def renew(self, *, name: str, version: int, lease_s: float) -> VersionInfo:
        """See :meth:`SourceRegistry.renew`."""
        return VersionInfo(**self._call("renew", name=name, version=version, lease_s=lease_s))

    def commit(self, *, name: str, version: int) -> None:
        """See :meth:`SourceRegistry.commit`."""
        self._call("commit", name=name, version=version)

    def abort(self, *, name: str, version: int, reason: str) -> None:
        """See :meth:`SourceRegistry.abort`."""
        self._call("abort", name=name, version=version, reason=reason)

    def info(self, *, name: str, version: int) -> VersionInfo:
        """See :meth:`SourceRegistry.info`."""
        return VersionInfo(**self._call("info", name=name, version=version))

    def latest_committed(self, *, name: str) -> int | None:
        """See :meth:`SourceRegistry.latest_committed`."""
        result = self._call("latest_committed", name=name)
        return None if result is None else int(result)

    def announce(self, *, name: str, version: int, address: str, complete: bool) -> None:
        """See :meth:`SourceRegistry.announce`."""
        self._call("announce", name=name, version=version, address=address, complete=complete)

    def withdraw(self, *, name: str, version: int, address: str) -> None:
        """See :meth:`SourceRegistry.withdraw`."""
        self._call("withdraw", name=name, version=version, address=address)

    def report_dead(self, *, name: str, version: int, address: str) -> None:
        """See :meth:`SourceRegistry.report_dead`."""
        self._call("report_dead", name=name, version=version, address=address)

    def assign_source(
        self,
        *,
        name: str,
        version: int,
        receiver: str,
        exclude: Iterable[str] = (),
        relays: bool = True,
    ) -> str:
        """See :meth:`SourceRegistry.assign_source`."""
        return str(
            self._call(
                "assign_source",
                name=name,
                version=version,
                receiver=receiver,
                exclude=sorted(exclude),
                relays=relays,
            )
        )

    def release_source(self, *, name: str, version: int, receiver: str) -> None:
        """See :meth:`SourceRegistry.release_source`."""
        self._call("release_source", name=name, version=version, receiver=receiver)

    def wait(
        self, *, name: str, version: int, min_complete: int | None, timeout: float
    ) -> VersionInfo:
        """See :meth:`SourceRegistry.wait`; the reply may take ``timeout`` more than a call."""
        kwargs = {
            "name": name,
            "version": version,
            "min_complete": min_complete,
            "timeout": timeout,
        }
        return VersionInfo(**self._blocking_call("wait", kwargs, timeout, needs=1))

    def open_pull(
        self,
        *,
        name: str,
        version: int,
        receiver: str,
        exclude: Iterable[str] = (),
        relays: bool = True,
        announce: bool = False,
        withdraw: int | None = None,
    ) -> tuple[str, VersionInfo]:
        """See :meth:`SourceRegistry.open_pull` (protocol 2)."""
        source, info = self._call(
            "open_pull",
            needs=2,
            name=name,
            version=version,
            receiver=receiver,
            exclude=sorted(exclude),
            relays=relays,
            announce=announce,
            withdraw=withdraw,
        )
        return str(source), VersionInfo(**info)

    def close_pull(self, *, name: str, version: int, receiver: str, timeout: float) -> VersionInfo:
        """See :meth:`SourceRegistry.close_pull` (protocol 2); may take ``timeout`` more."""
        kwargs = {"name": name, "version": version, "receiver": receiver, "timeout": timeout}
        return VersionInfo(**self._blocking_call("close_pull", kwargs, timeout, needs=2))
