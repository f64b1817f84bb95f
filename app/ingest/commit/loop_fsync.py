"""Await an fsync from the event loop without a GIL hand-off.

The group committer must not answer a request before the WAL holding its batch is fsynced, and
must not block the event loop on the disk meanwhile (a sick disk can take seconds). Handing the
fsync to a Python thread (``asyncio.to_thread``) does neither, but each of that thread's returns
(from ``open``, ``fsync``, ``close``, then to wake the loop) waits for the GIL, which a busy loop
gives up only every switch interval (5 ms): measured in ``benchmarks/ingest.py``, a group commit
took 2.4-3.3 ms mean for a 0.2 ms fsync, and every ingest request waits for one.

``LoopFsync`` runs each fsync on a native thread (``_fsyncd.c``, which never takes the GIL) that
reports ``(tag, errno, which)`` on a Unix socket pair; the loop reads the report as soon as it
next polls its file descriptors, between two requests. Where the native module is not built
(no C compiler at install time) ``native_fsync_available()`` is False and the caller keeps the
thread path.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import struct
from types import ModuleType


def _native() -> ModuleType | None:
    try:
        from app.ingest.commit import _fsyncd
    except ImportError:  # built by setup.py where a C compiler was found
        return None
    return _fsyncd


_fsyncd = _native()

_RECORD = struct.Struct("=Qii")  # tag, errno, which (0: the path, 1: the fallback)


def native_fsync_available() -> bool:
    return _fsyncd is not None


class LoopFsync:
    """fsyncs for one event loop; ``await fsync(path)`` returns once the file is on disk."""

    def __init__(self) -> None:
        if _fsyncd is None:
            raise RuntimeError("app.ingest.commit._fsyncd is not built (see setup.py)")
        self._reader, self._writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._reader.setblocking(False)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tags = itertools.count(1)
        # tag -> (future, path, fallback): a report is matched by its tag, so one that arrives
        # after its caller gave up (cancelled) is dropped instead of answering the next call.
        self._pending: dict[int, tuple[asyncio.Future[str], str, str | None]] = {}
        self._partial = b""
        self.late_reports = 0  # reports of fsyncs whose caller had given up

    async def fsync(self, path: str, *, fallback: str | None = None) -> str:
        """fsync ``path`` (or ``fallback`` when ``path`` does not exist); returns the path
        synced. Raises ``OSError`` (with the errno and the path) when that fails."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            loop.add_reader(self._reader.fileno(), self._on_reports)
        elif self._loop is not loop:
            raise RuntimeError("a LoopFsync serves the event loop that first used it")
        tag = next(self._tags)
        done: asyncio.Future[str] = loop.create_future()
        self._pending[tag] = (done, path, fallback)
        try:
            assert _fsyncd is not None
            _fsyncd.start(path, fallback, self._writer.fileno(), tag)
        except BaseException:
            del self._pending[tag]
            raise
        try:
            return await done
        finally:
            self._pending.pop(tag, None)

    def _on_reports(self) -> None:
        try:
            data = self._partial + self._reader.recv(64 * _RECORD.size)
        except BlockingIOError:
            return
        whole = len(data) - len(data) % _RECORD.size
        self._partial = data[whole:]
        for tag, err, which in _RECORD.iter_unpack(data[:whole]):
            entry = self._pending.pop(tag, None)
            if entry is None or entry[0].done():
                self.late_reports += 1
                continue
            done, path, fallback = entry
            synced = fallback if which and fallback is not None else path
            if err:
                done.set_exception(OSError(err, os.strerror(err), synced))
            else:
                done.set_result(synced)

    def close(self) -> None:
        """Stop listening (call it on the loop's thread). An fsync still running finishes on
        its thread; its report goes nowhere."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._reader.fileno())
        for done, _path, _fallback in self._pending.values():
            if not done.done():
                done.cancel()
        self._pending.clear()
        self._reader.close()
        self._writer.close()
