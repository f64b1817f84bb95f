"""Who holds which weight-set version: the registry receivers ask for a source.

The publisher opens a version under a lease it must keep renewing; the version becomes usable
(committed) only when the publisher commits it. If the publisher dies first, its lease runs out
and the version is aborted: every receiver discards its partial copy and stays on the previous
version. Receivers register as (partial) sources once they know the manifest, and as complete
sources when done, which makes them relays. Sources are handed out least-loaded first, relays
before the publisher, never one that is downstream of the asker (that would wait in a cycle).

:class:`InMemoryRegistry` is the reference implementation; ``registry_net`` serves it over TCP so
separate processes share one (the coordinator can implement the same :class:`SourceRegistry`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from recovery.transfer.errors import (
    NoSourceError,
    TransferConfigError,
    UnknownVersionError,
    VersionDiscardedError,
)

PUBLISHING = "publishing"
COMMITTED = "committed"
ABORTED = "aborted"


@dataclass(frozen=True)
class VersionInfo:
    """A registry's view of one version."""

    name: str
    version: int
    state: str
    manifest_digest: str
    publisher: str
    complete_sources: int
    reason: str = ""


class SourceRegistry(Protocol):
    """What publishers and receivers need from a registry (in-process or remote)."""

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
        """Open ``version`` as publishing, held by ``publisher`` for ``lease_s`` seconds; with
        ``commit_at``, the registry commits it itself once that many complete sources (the
        publisher counted) hold it while the lease is live, which spares the receiver waiting
        on the publisher's own commit the round trips through the publisher."""
        ...

    def renew(self, *, name: str, version: int, lease_s: float) -> VersionInfo:
        """Extend the publisher's lease; raises VersionDiscardedError once aborted.

        Also the publisher's proof of life, before and after the commit: it lifts a receiver's
        report that the publisher is dead.
        """
        ...

    def commit(self, *, name: str, version: int) -> None:
        """Make the version usable; only from publishing with a live lease."""
        ...

    def abort(self, *, name: str, version: int, reason: str) -> None:
        """Discard the version everywhere (no-op if already aborted)."""
        ...

    def info(self, *, name: str, version: int) -> VersionInfo:
        """The version's state (a lapsed lease is turned into an abort here)."""
        ...

    def latest_committed(self, *, name: str) -> int | None:
        """The newest committed version of ``name``, if any."""
        ...

    def announce(self, *, name: str, version: int, address: str, complete: bool) -> None:
        """``address`` can serve the version (partially, or completely)."""
        ...

    def withdraw(self, *, name: str, version: int, address: str) -> None:
        """``address`` no longer serves the version."""
        ...

    def report_dead(self, *, name: str, version: int, address: str) -> None:
        """A receiver found ``address`` dead; it is not handed out again."""
        ...

    def assign_source(
        self, *, name: str, version: int, receiver: str, exclude: Iterable[str], relays: bool
    ) -> str:
        """Pick a source for ``receiver``; raises NoSourceError when none is usable right now."""
        ...

    def release_source(self, *, name: str, version: int, receiver: str) -> None:
        """``receiver`` stopped pulling from the source it was assigned."""
        ...

    def wait(
        self, *, name: str, version: int, min_complete: int | None, timeout: float
    ) -> VersionInfo:
        """The version's state once it is no longer publishing, or (with ``min_complete``) once
        that many complete sources hold it, or when ``timeout`` seconds have passed, whichever
        is first: what a publisher waiting to commit and a receiver waiting for the commit
        block on, instead of polling :meth:`info`."""
        ...

    def open_pull(
        self,
        *,
        name: str,
        version: int,
        receiver: str,
        exclude: Iterable[str],
        relays: bool,
        announce: bool,
        withdraw: int | None,
    ) -> tuple[str, VersionInfo]:
        """The start of a pull in one call: :meth:`withdraw` ``receiver`` from version
        ``withdraw`` (what its staging slot held), :meth:`announce` it as a partial source of
        ``version`` (with ``announce``), :meth:`assign_source`; the source and the version's
        info (the manifest digest to check). NoSourceError as :meth:`assign_source`."""
        ...

    def close_pull(self, *, name: str, version: int, receiver: str, timeout: float) -> VersionInfo:
        """The end of a complete pull in one call: :meth:`release_source`, :meth:`announce`
        ``receiver`` as a complete source, and :meth:`wait` up to ``timeout`` for the commit."""
        ...


@dataclass
class _Source:
    address: str
    complete: bool
    order: int
    load: int = 0
    dead: bool = False


@dataclass
class _Entry:
    info: VersionInfo
    lease_deadline: float
    commit_at: int | None = None
    sources: dict[str, _Source] = field(default_factory=dict)
    upstream: dict[str, str] = field(default_factory=dict)  # receiver -> its assigned source


class InMemoryRegistry:
    """Thread-safe :class:`SourceRegistry`; ``clock`` is injectable for lease tests."""

    def __init__(
        self, *, keep_versions: int = 4, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if keep_versions < 2:
            raise TransferConfigError(f"keep_versions must be at least 2, got {keep_versions!r}")
        self._keep = keep_versions
        self._clock = clock
        self._lock = threading.Lock()
        # Notified on every change a waiter may be waiting for (sources, state).
        self._changed = threading.Condition(self._lock)
        self._entries: dict[tuple[str, int], _Entry] = {}
        self._order = 0

    def _entry(self, name: str, version: int) -> _Entry:
        entry = self._entries.get((name, version))
        if entry is None:
            raise UnknownVersionError(f"the registry knows no {name!r} v{version}")
        if entry.info.state == PUBLISHING and self._clock() > entry.lease_deadline:
            self._set_state(entry, ABORTED, "publisher lease expired before commit")
        return entry

    def _set_state(self, entry: _Entry, state: str, reason: str = "") -> None:
        # Called with the lock held, after every change to an entry.
        complete = sum(1 for s in entry.sources.values() if s.complete and not s.dead)
        if state == PUBLISHING and entry.commit_at is not None and complete >= entry.commit_at:
            # The publisher's own rule, applied where the replica's announcement lands; the
            # lease was live (an expired one was turned into an abort before we got here).
            state = COMMITTED
        i = entry.info
        info = VersionInfo(
            i.name, i.version, state, i.manifest_digest, i.publisher, complete, reason
        )
        if info != i:
            entry.info = info
            self._changed.notify_all()

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
        """Open ``version``; it must be newer than every version of ``name`` seen so far."""
        if not lease_s > 0:
            raise TransferConfigError(f"lease_s must be positive, got {lease_s!r}")
        if commit_at is not None and (
            isinstance(commit_at, bool) or not isinstance(commit_at, int) or commit_at < 2
        ):
            raise TransferConfigError(f"commit_at must be an int >= 2 or None, got {commit_at!r}")
        if not isinstance(version, int) or version < 0:
            raise TransferConfigError(f"version must be a non-negative int, got {version!r}")
        with self._lock:
            known = [v for (n, v) in self._entries if n == name]
            if known and version <= max(known):
                raise TransferConfigError(
                    f"{name!r} v{version} is not newer than v{max(known)} already published"
                )
            self._order += 1
            entry = _Entry(
                VersionInfo(name, version, PUBLISHING, manifest_digest, publisher, 1),
                self._clock() + lease_s,
                commit_at,
                {publisher: _Source(publisher, True, self._order)},
            )
            self._entries[(name, version)] = entry
            for old in sorted(known)[: max(0, len(known) + 1 - self._keep)]:
                del self._entries[(name, old)]

    def renew(self, *, name: str, version: int, lease_s: float) -> VersionInfo:
        """Extend the lease by ``lease_s`` from now."""
        with self._lock:
            entry = self._entry(name, version)
            if entry.info.state == ABORTED:
                raise VersionDiscardedError(f"{name!r} v{version} was aborted: {entry.info.reason}")
            entry.lease_deadline = self._clock() + lease_s
            publisher = entry.sources.get(entry.info.publisher)
            if publisher is not None:
                publisher.dead = False  # it renews, so it lives: a receiver's report was a hiccup
            self._set_state(entry, entry.info.state, entry.info.reason)
            return entry.info

    def commit(self, *, name: str, version: int) -> None:
        """Publishing → committed."""
        with self._lock:
            entry = self._entry(name, version)
            if entry.info.state == ABORTED:
                raise VersionDiscardedError(f"{name!r} v{version} was aborted: {entry.info.reason}")
            self._set_state(entry, COMMITTED)

    def abort(self, *, name: str, version: int, reason: str) -> None:
        """Publishing → aborted (committed versions stay committed)."""
        with self._lock:
            entry = self._entry(name, version)
            if entry.info.state == PUBLISHING:
                self._set_state(entry, ABORTED, reason)

    def info(self, *, name: str, version: int) -> VersionInfo:
        """Current view of the version."""
        with self._lock:
            entry = self._entry(name, version)
            self._set_state(entry, entry.info.state, entry.info.reason)
            return entry.info

    def latest_committed(self, *, name: str) -> int | None:
        """Newest committed version of ``name``."""
        with self._lock:
            done = [
                v for (n, v), e in self._entries.items() if n == name and e.info.state == COMMITTED
            ]
            return max(done) if done else None

    def announce(self, *, name: str, version: int, address: str, complete: bool) -> None:
        """Register ``address`` as a source."""
        with self._lock:
            entry = self._entry(name, version)
            if entry.info.state == ABORTED:
                raise VersionDiscardedError(f"{name!r} v{version} was aborted: {entry.info.reason}")
            source = entry.sources.get(address)
            if source is None or source.dead:
                self._order += 1
                entry.sources[address] = _Source(address, complete, self._order)
            else:
                source.complete = source.complete or complete
            self._set_state(entry, entry.info.state, entry.info.reason)

    def withdraw(self, *, name: str, version: int, address: str) -> None:
        """Forget ``address`` as a source."""
        with self._lock:
            entry = self._entries.get((name, version))
            if entry is not None:
                entry.sources.pop(address, None)
                self._set_state(entry, entry.info.state, entry.info.reason)

    def report_dead(self, *, name: str, version: int, address: str) -> None:
        """Never hand out ``address`` for this version again (until it re-announces)."""
        with self._lock:
            entry = self._entries.get((name, version))
            if entry is not None and address in entry.sources:
                entry.sources[address].dead = True
                self._set_state(entry, entry.info.state, entry.info.reason)

    def wait(
        self, *, name: str, version: int, min_complete: int | None, timeout: float
    ) -> VersionInfo:
        """See :meth:`SourceRegistry.wait`. A lease that lapses while waiting ends the wait
        (the version is then aborted)."""
        if not timeout >= 0:
            raise TransferConfigError(f"timeout must be >= 0, got {timeout!r}")
        if min_complete is not None and (
            isinstance(min_complete, bool) or not isinstance(min_complete, int)
        ):
            raise TransferConfigError(f"min_complete must be an int or None, got {min_complete!r}")
        deadline = self._clock() + timeout
        with self._lock:
            while True:
                info = self._entry(name, version).info
                if info.state != PUBLISHING or (
                    min_complete is not None and info.complete_sources >= min_complete
                ):
                    return info
                now = self._clock()
                left = min(deadline, self._entries[(name, version)].lease_deadline) - now
                if now >= deadline:
                    return info
                # Woken by any change; the lease deadline bounds the sleep so that a lapsed
                # lease is seen (as an abort) without anyone else calling in.
                self._changed.wait(max(left, 0.001))

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
        """See :meth:`SourceRegistry.open_pull` (each step as its own call would do it)."""
        if withdraw is not None:
            self.withdraw(name=name, version=withdraw, address=receiver)
        if announce:
            self.announce(name=name, version=version, address=receiver, complete=False)
        source = self.assign_source(
            name=name, version=version, receiver=receiver, exclude=exclude, relays=relays
        )
        return source, self.info(name=name, version=version)

    def close_pull(self, *, name: str, version: int, receiver: str, timeout: float) -> VersionInfo:
        """See :meth:`SourceRegistry.close_pull`."""
        self.release_source(name=name, version=version, receiver=receiver)
        self.announce(name=name, version=version, address=receiver, complete=True)
        return self.wait(name=name, version=version, min_complete=None, timeout=timeout)

    def _downstream_of(self, entry: _Entry, candidate: str, receiver: str) -> bool:
        seen: set[str] = set()
        node: str | None = candidate
        while node is not None and node not in seen:
            if node == receiver:
                return True
            seen.add(node)
            node = entry.upstream.get(node)
        return False

    def assign_source(
        self,
        *,
        name: str,
        version: int,
        receiver: str,
        exclude: Iterable[str] = (),
        relays: bool = True,
    ) -> str:
        """Least-loaded live source, relays before the publisher, complete before partial."""
        excluded = set(exclude)
        with self._lock:
            entry = self._entry(name, version)
            if entry.info.state == ABORTED:
                raise VersionDiscardedError(f"{name!r} v{version} was aborted: {entry.info.reason}")
            publisher = entry.info.publisher
            candidates = [
                s
                for s in entry.sources.values()
                if not s.dead
                and s.address != receiver
                and s.address not in excluded
                and (relays or s.address == publisher)
                and not self._downstream_of(entry, s.address, receiver)
            ]
            if not candidates:
                raise NoSourceError(f"no live source of {name!r} v{version} for {receiver}")
            best = min(
                candidates,
                key=lambda s: (s.load, not s.complete, s.address == publisher, s.order),
            )
            self._release(entry, receiver)
            best.load += 1
            entry.upstream[receiver] = best.address
            return best.address

    def _release(self, entry: _Entry, receiver: str) -> None:
        previous = entry.upstream.pop(receiver, None)
        if previous is not None and previous in entry.sources:
            entry.sources[previous].load = max(0, entry.sources[previous].load - 1)

    def release_source(self, *, name: str, version: int, receiver: str) -> None:
        """Drop ``receiver``'s assignment (its load on the source ends)."""
        with self._lock:
            entry = self._entries.get((name, version))
            if entry is not None:
                self._release(entry, receiver)
