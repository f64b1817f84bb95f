"""Network namespaces joined by veth pairs to a bridge, each host's egress capped with ``tc``.

Used by ``benchmarks/transfer.py`` for the fan-out part, so that links (not this machine's CPUs)
are the bottleneck: host i lives in namespace ``<prefix>h<i>`` with address 10.77.0.<i+1> on
``eth0``; every ``eth0`` has a token-bucket (tbf) egress limit; a switch namespace
``<prefix>sw`` holds the bridge, with address 10.77.0.254 (for the registry, uncapped).
Everything is removed by :meth:`Topology.close`, also on errors (use it as a context manager).
"""

from __future__ import annotations

import subprocess
from types import TracebackType

SUBNET = "10.77.0"
SWITCH_IP = f"{SUBNET}.254"


def run(*args: str) -> None:
    """Run an ``ip``/``tc`` command, raising with its stderr on failure."""
    proc = subprocess.run(args, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {proc.stderr.strip()}")


def namespaces_available() -> tuple[bool, str]:
    """Can this process create namespaces and veth pairs (root, kernel support)?"""
    probe = "rlgb-probe"
    try:
        run("ip", "netns", "add", probe)
    except (RuntimeError, FileNotFoundError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    try:
        run("ip", "-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1")
        run(
            "tc",
            "-n",
            probe,
            "qdisc",
            "add",
            "dev",
            "p0",
            "root",
            "tbf",
            "rate",
            "10mbit",
            "burst",
            "32kb",
            "latency",
            "50ms",
        )
        return True, ""
    except (RuntimeError, FileNotFoundError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)


class Topology:
    """``hosts`` namespaces on one bridge, each host's egress capped at ``rate_mbit``."""

    def __init__(self, prefix: str, hosts: int, rate_mbit: float) -> None:
        self.prefix = prefix
        self.hosts = hosts
        self.rate_mbit = rate_mbit
        self.switch = f"{prefix}sw"
        self._created: list[str] = []

    def ns(self, i: int) -> str:
        return f"{self.prefix}h{i}"

    def ip(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def __enter__(self) -> Topology:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _add_ns(self, name: str) -> None:
        run("ip", "netns", "add", name)
        self._created.append(name)
        run("ip", "-n", name, "link", "set", "lo", "up")

    def _build(self) -> None:
        self._add_ns(self.switch)
        run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", self.switch, "addr", "add", f"{SWITCH_IP}/24", "dev", "br0")
        run("ip", "-n", self.switch, "link", "set", "br0", "up")
        # Burst of a few MTUs per 10 Mbit/s keeps tbf accurate without starving TCP.
        burst_kb = max(32, int(self.rate_mbit / 10 * 8))
        for i in range(self.hosts):
            ns = self.ns(i)
            self._add_ns(ns)
            port = f"{self.prefix}p{i}"[:15]
            run("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", port)
            run("ip", "-n", ns, "link", "set", port, "netns", self.switch)
            run("ip", "-n", self.switch, "link", "set", port, "master", "br0")
            run("ip", "-n", self.switch, "link", "set", port, "up")
            run("ip", "-n", ns, "addr", "add", f"{self.ip(i)}/24", "dev", "eth0")
            run("ip", "-n", ns, "link", "set", "eth0", "up")
            run(
                "tc",
                "-n",
                ns,
                "qdisc",
                "add",
                "dev",
                "eth0",
                "root",
                "tbf",
                "rate",
                f"{self.rate_mbit}mbit",
                "burst",
                f"{burst_kb}kb",
                "latency",
                "100ms",
            )

    def exec_prefix(self, ns: str) -> list[str]:
        """Command prefix that runs a program inside namespace ``ns``."""
        return ["ip", "netns", "exec", ns]

    def close(self) -> None:
        """Delete every namespace created (their veths and qdiscs go with them)."""
        while self._created:
            name = self._created.pop()
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


def cleanup_stale(prefix: str = "rlgb-") -> list[str]:
    """Delete namespaces left by an earlier run that was killed (``--cleanup``)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    removed = []
    for line in out.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(prefix):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
            removed.append(name)
    return removed
