"""The registry over TCP, so a publisher and receivers in separate processes share one.

One JSON request and one JSON reply per call. Errors come back by name and are re-raised as the
same typed errors on the client side.
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
    TransferConfigError,
    TransferError,
    UnknownVersionError,
    VersionDiscardedError,
)
from recovery.transfer.registry import SourceRegistry, VersionInfo
from recovery.transfer.tcp import TcpChannel, TcpTransport
from recovery.transfer.wire import recv_message, send_message

log = logging.getLogger("rlguard.recovery.transfer.registry")

_METHODS = frozenset(
    {
        "begin", "renew", "commit", "abort", "info", "latest_committed", "announce",
        "withdraw", "report_dead", "assign_source", "release_source",
    }
)
_ERRORS: dict[str, type[TransferError]] = {
    cls.__name__: cls
    for cls in (NoSourceError, UnknownVersionError, VersionDiscardedError, TransferConfigError)
}


class RegistryServer:
    """Serves ``registry`` on ``host:port`` (0 = a free port) until :meth:`close`."""

    def __init__(self, registry: SourceRegistry, *, host: str = "127.0.0.1", port: int = 0,
                 idle_timeout: float = 600.0) -> None:
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
        method, kwargs = request.get("op"), request.get("kwargs")
        if method not in _METHODS or not isinstance(kwargs, dict):
            return {"ok": False, "error": "TransferConfigError", "detail": f"unknown call {method!r}"}
        try:
            result = getattr(self.registry, method)(**kwargs)
        except TransferError as exc:
            return {"ok": False, "error": type(exc).__name__, "detail": str(exc)}
        except TypeError as exc:  # wrong keyword arguments: a client bug, answered not crashed
            return {"ok": False, "error": "TransferConfigError", "detail": str(exc)}
        if isinstance(result, VersionInfo):
            result = dataclasses.asdict(result)
        return {"ok": True, "result": result}


class RegistryClient:
    """A :class:`SourceRegistry` whose calls go to a :class:`RegistryServer`; thread-safe."""

    def __init__(self, address: str, *, timeout: float = 10.0) -> None:
        self.address = address
        self.timeout = timeout
        self._lock = threading.Lock()
        self._channel: TcpChannel | None = None

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None

    def _call(self, op: str, **kwargs: Any) -> Any:
        with self._lock:
            try:
                if self._channel is None:
                    self._channel = TcpTransport().connect(self.address, timeout=self.timeout)
                send_message(self._channel, {"op": op, "kwargs": kwargs}, timeout=self.timeout)
                reply = recv_message(self._channel, timeout=self.timeout)
            except TransferError:
                if self._channel is not None:
                    self._channel.close()
                self._channel = None
                raise
        if reply.get("ok"):
            return reply.get("result")
        error = _ERRORS.get(str(reply.get("error")), ProtocolError)
        raise error(f"registry {self.address}: {reply.get('detail')}")

    def begin(self, *, name: str, version: int, manifest_digest: str, publisher: str, lease_s: float) -> None:
        """See :meth:`SourceRegistry.begin`."""
        self._call("begin", name=name, version=version, manifest_digest=manifest_digest,
                   publisher=publisher, lease_s=lease_s)

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
        self, *, name: str, version: int, receiver: str, exclude: Iterable[str] = (), relays: bool = True
    ) -> str:
        """See :meth:`SourceRegistry.assign_source`."""
        return str(self._call("assign_source", name=name, version=version, receiver=receiver,
                              exclude=sorted(exclude), relays=relays))

    def release_source(self, *, name: str, version: int, receiver: str) -> None:
        """See :meth:`SourceRegistry.release_source`."""
        self._call("release_source", name=name, version=version, receiver=receiver)
