"""A publisher or relay in its own process, driven by line commands on stdin.

Started by the integration tests (``python -m tests.integration.transfer._peer ...``). Prints one
JSON event per line on stdout. Commands: ``publish V``, ``pull V``, ``corrupt CHUNK``, ``exit``.
Exits by itself after ``--max-life`` seconds so a failed test never leaks it.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import zlib

from recovery.transfer import (
    RegistryClient,
    TransferError,
    WeightPublisher,
    WeightReceiver,
    make_transport,
)
from recovery.transfer.manifest import byte_view
from tests.integration.transfer.weights import NAME, make_weights, same_bits, specs


def emit(**event: object) -> None:
    print(json.dumps(event), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=["publisher", "relay"], required=True)
    parser.add_argument("--registry", required=True)
    parser.add_argument("--transport", default="tcp")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--egress", type=float, default=0.0, help="bytes/s cap, 0 = none")
    parser.add_argument("--chunk-bytes", type=int, default=16 << 10)
    parser.add_argument("--lease-s", type=float, default=1.0)
    parser.add_argument("--max-life", type=float, default=120.0)
    args = parser.parse_args()

    threading.Timer(args.max_life, lambda: __import__("os")._exit(3)).start()
    transport = make_transport(args.transport)
    registry = RegistryClient(args.registry, timeout=5.0)
    egress = args.egress or None
    if args.role == "publisher":
        node: WeightPublisher | WeightReceiver = WeightPublisher(
            NAME,
            transport=transport,
            registry=registry,
            lease_s=args.lease_s,
            chunk_bytes=args.chunk_bytes,
            egress_bytes_per_s=egress,
        )
    else:
        node = WeightReceiver(
            NAME,
            specs(),
            transport=transport,
            registry=registry,
            timeout=2.0,
            egress_bytes_per_s=egress,
        )
    emit(event="ready", address=node.address)
    for line in sys.stdin:
        command, _, value = line.strip().partition(" ")
        if command == "exit":
            break
        if command == "publish" and isinstance(node, WeightPublisher):
            version = int(value)
            publication = node.publish(version, make_weights(args.seed, version))
            emit(event="published", version=version)

            def wait(pub=publication, v=version) -> None:
                try:
                    pub.wait_committed(timeout=60)
                    emit(event="committed", version=v)
                except TransferError as exc:
                    emit(event="aborted", version=v, error=str(exc))

            threading.Thread(target=wait, daemon=True).start()
        elif command == "pull" and isinstance(node, WeightReceiver):
            version = int(value)
            try:
                report = node.pull(version, timeout=60)
                expected = make_weights(args.seed, version)
                exact = all(same_bits(node.live_tensors[k], expected[k]) for k in expected)
                emit(event="pulled", version=version, exact=exact, sources=report.chunks_by_source)
            except TransferError as exc:
                live = node.live_version
                exact = live is not None and all(
                    same_bits(node.live_tensors[k], t)
                    for k, t in make_weights(args.seed, live).items()
                )
                emit(
                    event="failed",
                    version=version,
                    error=type(exc).__name__,
                    live=live,
                    live_exact=exact,
                )
        elif command == "egress":
            server = node.server
            assert server is not None
            server.set_egress_limit(float(value) or None)
            emit(event="egress", bytes_per_s=float(value))
        elif command == "corrupt" and isinstance(node, WeightReceiver):
            # Bit rot in the relay's copy after it was verified: the next puller must notice.
            tensors = node.live_tensors
            first = byte_view(tensors[specs()[0].name])
            before = zlib.crc32(first)
            first[int(value)] ^= 0xFF
            emit(event="corrupted", byte=int(value), crc_before=before)
        else:
            emit(event="error", detail=f"cannot {line.strip()!r} as {args.role}")
    emit(event="bye")


if __name__ == "__main__":
    main()
