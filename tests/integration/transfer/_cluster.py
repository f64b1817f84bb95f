"""Peer processes of the weight transfer and a cluster of them, for the transfer tests."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from recovery.transfer import InMemoryRegistry, RegistryServer, make_transport
from recovery.transfer.transport import Transport
from tests.harness import spawn

ROOT = Path(__file__).resolve().parents[3]


class Peer:
    """A ``_peer`` process: send it commands, wait for its JSON events."""

    def __init__(self, role: str, registry: str, transport: str, *extra: str) -> None:
        self.proc = spawn(
            [
                sys.executable,
                "-m",
                "tests.integration.transfer._peer",
                "--role",
                role,
                "--registry",
                registry,
                "--transport",
                transport,
                *extra,
            ],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._address: str | None = None

    @property
    def address(self) -> str:
        if self._address is None:
            self._address = str(self.wait("ready", timeout=60)["address"])
        return self._address

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.put(json.loads(line))

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def wait(self, *kinds: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"peer {self.proc.pid} sent none of {kinds} in {timeout}s")
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                continue
            if event["event"] in kinds:
                return event

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)  # a stopped process must be able to die
            self.proc.kill()
        self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


class Cluster:
    """A registry in this process plus peer processes, all cleaned up at the end."""

    def __init__(self, transport: str) -> None:
        self.transport_name = transport
        self.registry = InMemoryRegistry()
        self.server = RegistryServer(self.registry)
        self.peers: list[Peer] = []

    def peer(self, role: str, *extra: str) -> Peer:
        """Start a peer and wait until it serves."""
        (peer,) = self.start((role, *extra))
        return peer

    def start(self, *specs: tuple[str, ...]) -> list[Peer]:
        """Start several peers at once (their start-up, mostly importing torch, overlaps)."""
        started = [
            Peer(spec[0], self.server.address, self.transport_name, *spec[1:]) for spec in specs
        ]
        self.peers.extend(started)
        for peer in started:
            assert peer.address
        return started

    def close(self) -> None:
        for peer in self.peers:
            peer.kill()
        self.server.close()
        if self.transport_name == "shm":
            # Peers killed with SIGKILL could not unlink their segments.
            from recovery.transfer.shm import ShmTransport

            ShmTransport(sweep=False).sweep_stale()


def _transport_or_skip(name: str) -> Transport:
    if name == "ucx":
        pytest.importorskip(
            "ucxx", reason="ucx transport: the optional 'ucx' extra (ucxx) is not installed"
        )
    return make_transport(name)
