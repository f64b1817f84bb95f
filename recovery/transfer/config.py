"""Choosing a transport by name, as the job's configuration says (``tcp`` is the default)."""

from __future__ import annotations

from typing import Any

from recovery.transfer.errors import TransferConfigError
from recovery.transfer.transport import Transport

TRANSPORTS = ("tcp", "shm", "ucx")


def make_transport(kind: str = "tcp", **options: Any) -> Transport:
    """Build the transport named ``kind`` (``tcp``, ``shm`` or ``ucx``) with its options.

    ``ucx`` raises TransportUnavailableError when the ``ucx`` extra (``ucxx``) is not installed.
    """
    if kind == "tcp":
        from recovery.transfer.tcp import TcpTransport

        if options:
            raise TransferConfigError(f"the tcp transport takes no options, got {sorted(options)}")
        return TcpTransport()
    if kind == "shm":
        from recovery.transfer.shm import ShmTransport

        return ShmTransport(**options)
    if kind == "ucx":
        from recovery.transfer.ucx import UcxTransport

        return UcxTransport(**options)
    raise TransferConfigError(f"unknown transport {kind!r}; choose one of {TRANSPORTS}")
