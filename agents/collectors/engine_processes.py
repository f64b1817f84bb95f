"""Whether an inference engine's processes live, level by level: the signal that tells a dead
engine from a slow one at once, without waiting for a probe to fail.

An engine is a process tree (for vLLM: APIServer → ``VLLM::EngineCore`` → ``VLLM::Worker``,
found by vLLM's own process titles, :func:`integrations.vllm.server.find_engine_tree`). A
failing ``/health`` probe cannot say whether the engine is gone, frozen or merely busy; the
process table can: a level whose process was seen and is now gone (or a zombie) is dead, and
when any level dies the engine is dead (vLLM's API server exits within a second of its
EngineCore; until it has, requests already fail). A frozen level (SIGSTOP, a debugger) lives
on: that is the hung case, which the probe sees.

The root is the API server: given as ``pid=`` on ``--engine``, or found as the process that
listens on the engine's port when the engine runs on this node. A new root on that port (the
engine restarted) starts a new watch: its levels count from its own start, which is also the
start the server's per-engine-kind start-up grace counts from (``rollout_engine_uptime_seconds``).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

log = logging.getLogger("rlguard.agent.engines")

API_SERVER, ENGINE_CORE, WORKER = "api_server", "engine_core", "worker"
LEVELS = (API_SERVER, ENGINE_CORE, WORKER)
# Looking up a port's listener reads every process's open sockets: not every round while the
# engine is away (restarting), only this often.
_DISCOVER_EVERY_SECONDS = 1.0


@dataclass(frozen=True)
class _Proc:
    pid: int
    create_time: float


@dataclass(frozen=True)
class ProcessView:
    """One round's look at the tree: per level seen so far, whether it is dead; the root's
    start (epoch seconds) while it lives."""

    dead: dict[str, bool]
    started_at: float | None


def _identify(pid: int) -> _Proc | None:
    try:
        return _Proc(pid, psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _alive(proc: _Proc) -> bool:
    """The same process (pid and start time: a reused pid is not it) and not a zombie."""
    try:
        p = psutil.Process(proc.pid)
        return bool(p.create_time() == proc.create_time and p.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _local_addresses() -> set[str]:
    addresses = {"localhost", "127.0.0.1", "::1", "0.0.0.0", socket.gethostname()}
    for entries in psutil.net_if_addrs().values():
        addresses.update(a.address for a in entries)
    return addresses


def is_local(host: str) -> bool:
    """Whether ``host`` names this machine (so its processes can be watched here)."""
    return host in _local_addresses()


def listener_pid(port: int) -> int | None:
    """The pid listening on TCP ``port`` on this machine, if any (and visible to us)."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return None
    for c in connections:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            return int(c.pid)
    return None


def _vllm_root(pid: int) -> int:
    from integrations.vllm.server import api_server_of

    try:
        return api_server_of(pid)
    except psutil.NoSuchProcess:
        return pid


def _vllm_levels(root: int) -> dict[str, list[int]]:
    from integrations.vllm.server import EngineError, find_engine_tree

    try:
        tree = find_engine_tree(root)
    except EngineError:
        return {}
    core = [tree.engine_core] if tree.engine_core is not None else []
    return {ENGINE_CORE: core, WORKER: list(tree.workers)}


# How each engine kind's lower levels are found under its root; a kind not listed is watched
# at its root only.
LEVEL_FINDERS: dict[str, Callable[[int], dict[str, list[int]]]] = {"vllm": _vllm_levels}
# How each engine kind's root is found from the pid that listens on its port.
ROOT_FINDERS: dict[str, Callable[[int], int]] = {"vllm": _vllm_root}


@dataclass
class EngineProcessWatch:
    """Watches one engine's tree across rounds (see the module docstring)."""

    kind: str
    port: int | None
    pid: int | None = None
    local: bool = True
    clock: Callable[[], float] = time.monotonic
    _root: _Proc | None = None
    _seen: dict[str, list[_Proc]] = field(default_factory=dict)
    _next_discovery: float = 0.0

    def observe(self) -> ProcessView | None:
        """This round's view; None when the engine's processes cannot be watched from here
        (a remote engine, no root found yet)."""
        if self._root is None or not _alive(self._root):
            self._discover()
        root = self._root
        if root is None:
            return None
        root_alive = _alive(root)
        if root_alive:
            finder = LEVEL_FINDERS.get(self.kind)
            for level, pids in (finder(root.pid) if finder else {}).items():
                known = {p.pid for p in self._seen.setdefault(level, [])}
                for pid in pids:
                    if pid not in known and (proc := _identify(pid)) is not None:
                        self._seen[level].append(proc)
        dead = {API_SERVER: not root_alive}
        for level in LEVELS[1:]:
            if self._seen.get(level):
                dead[level] = not all(_alive(p) for p in self._seen[level])
        return ProcessView(dead=dead, started_at=root.create_time if root_alive else None)

    def _discover(self) -> None:
        """Find the root: ``pid`` while it lives, else the port's listener; a root other than
        the one watched starts a new watch."""
        now = self.clock()
        if now < self._next_discovery:
            return
        self._next_discovery = now + _DISCOVER_EVERY_SECONDS
        candidate = None
        if self.pid is not None:
            candidate = _identify(self.pid)
            if candidate is not None and not _alive(candidate):
                candidate = None
        if candidate is None and self.local and self.port is not None:
            found = listener_pid(self.port)
            if found is not None:
                candidate = _identify(ROOT_FINDERS.get(self.kind, int)(found))
        if candidate is None or candidate == self._root:
            return
        if self._root is not None:
            log.info("engine on port %s: new process tree (root pid %d)", self.port, candidate.pid)
        self._root = candidate
        self._seen = {API_SERVER: [candidate]}
