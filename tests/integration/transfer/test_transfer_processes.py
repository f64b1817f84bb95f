"""Weight transfer between real processes on loopback: exactness, failover, abort, corruption.

Each test runs once per transport (tcp, shm, and ucx when the optional ``ucxx`` is installed).
The registry lives in the test process (standing in for the coordinator); publisher and relays
are separate processes that are killed with SIGKILL or frozen with SIGSTOP at bad moments.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from recovery.transfer import (
    NoSourceError,
    RegistryClient,
    TransferTimeout,
    VersionDiscardedError,
    WeightReceiver,
)
from recovery.transfer.client import SourceSession
from recovery.transfer.registry import ABORTED, COMMITTED
from recovery.transfer.shm import ShmTransport
from recovery.transfer.transport import Transport
from tests.harness import wait_for
from tests.integration.transfer._cluster import Cluster
from tests.integration.transfer.weights import NAME, make_weights, same_bits, specs

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(90)]

SLOW = str(120_000)  # bytes/s: the ~200 KB set takes ~1.7 s per copy, long enough to kill mid-way


def receiver(cluster: Cluster, transport: Transport, **kwargs: object) -> WeightReceiver:
    registry = RegistryClient(cluster.server.address, timeout=5.0)
    return WeightReceiver(NAME, specs(), transport=transport, registry=registry, **kwargs)  # type: ignore[arg-type]


def assert_exact(recv: WeightReceiver, version: int) -> None:
    expected = make_weights(0, version)
    for name, tensor in expected.items():
        assert same_bits(recv.live_tensors[name], tensor), (
            f"{name} differs after pulling v{version}"
        )


def test_every_dtype_arrives_bit_exact_direct_and_through_a_relay(
    cluster: Cluster, transport: Transport
) -> None:
    publisher, relay = cluster.start(("publisher",), ("relay",))
    publisher.send("publish 1")
    publisher.wait("published")
    relay.send("pull 1")
    assert relay.wait("pulled", "failed")["exact"] is True
    publisher.wait("committed")

    recv = receiver(cluster, transport)
    try:
        report = recv.pull(1, timeout=30)
        assert recv.live_version == 1
        assert_exact(recv, 1)
        # Relays are preferred over the trainer: every chunk came from the relay process.
        assert report.chunks_by_source == {relay.address: report.chunks_total}
        assert report.corrupt_chunks == 0
    finally:
        recv.close()


def test_source_killed_mid_transfer_resumes_from_another_relay_with_only_missing_chunks(
    cluster: Cluster, transport: Transport
) -> None:
    publisher, relay_a, relay_b = cluster.start(("publisher",), ("relay",), ("relay",))
    publisher.send("publish 1")
    publisher.wait("published")
    relay_a.send("pull 1")
    relay_a.wait("pulled")
    relay_b.send("pull 1")
    relay_b.wait("pulled")
    publisher.wait("committed")
    for relay in (relay_a, relay_b):  # now slow, so the pull below can be cut in the middle
        relay.send(f"egress {SLOW}")
        relay.wait("egress")

    recv = receiver(cluster, transport, timeout=2.0)
    result: dict[str, object] = {}
    thread = threading.Thread(target=lambda: result.update(report=recv.pull(1, timeout=60)))
    try:
        thread.start()
        wait_for(
            lambda: recv.verified_chunks >= 3 and recv.current_source is not None, 30, "3 chunks"
        )
        victim = relay_a if recv.current_source == relay_a.address else relay_b
        survivor = relay_b if victim is relay_a else relay_a
        os.kill(victim.proc.pid, signal.SIGKILL)
        thread.join(60)
        report = result["report"]
        assert_exact(recv, 1)
        assert report.dead_sources == [victim.address]  # type: ignore[attr-defined]
        got_before = report.chunks_by_source[victim.address]  # type: ignore[attr-defined]
        assert 3 <= got_before < report.chunks_total  # type: ignore[attr-defined]
        assert report.chunks_by_source[survivor.address] == report.chunks_total - got_before  # type: ignore[attr-defined]
        # The survivor's own counter: it served exactly the chunks the receiver was missing.
        # (For shm the bytes do not go through its server loop's payload path, but the chunk
        # stream and its counter do.)
        # The source counts a chunk once its send returned, which may be just after the
        # receiver already has it: wait for the count to settle, then it must be exact.
        missing = report.chunks_total - got_before  # type: ignore[attr-defined]
        with SourceSession(transport, survivor.address, timeout=5) as session:
            wait_for(
                lambda: session.stats()[f"{NAME}@1"]["served_chunks"] >= missing,
                10,
                "the survivor's served count",
            )
            served = session.stats()[f"{NAME}@1"]["served_chunks"]
        assert served == missing
    finally:
        thread.join(60)
        recv.close()


def test_trainer_killed_while_publishing_discards_the_version_everywhere(
    cluster: Cluster, transport: Transport
) -> None:
    publisher, relay = cluster.start(("publisher", "--lease-s", "1.0"), ("relay",))
    publisher.send("publish 1")
    publisher.wait("published")
    relay.send("pull 1")
    relay.wait("pulled")
    publisher.wait("committed")
    recv = receiver(cluster, transport, timeout=2.0)
    try:
        recv.pull(1, timeout=30)

        publisher.send(f"egress {SLOW}")
        publisher.wait("egress")
        publisher.send("publish 2")
        publisher.wait("published")
        relay.send("pull 2")
        errors: list[BaseException] = []

        def pull2() -> None:
            try:
                recv.pull(2, timeout=30)
            except VersionDiscardedError as exc:
                errors.append(exc)

        thread = threading.Thread(target=pull2)
        thread.start()
        wait_for(lambda: recv.verified_chunks >= 2, 30, "v2 under way")
        os.kill(publisher.proc.pid, signal.SIGKILL)
        thread.join(30)
        assert len(errors) == 1, "the receiver should have been told v2 was discarded"
        relay_result = relay.wait("pulled", "failed")
        assert relay_result == {
            "event": "failed",
            "version": 2,
            "error": "VersionDiscardedError",
            "live": 1,
            "live_exact": True,
        }
        assert recv.live_version == 1
        assert_exact(recv, 1)
        assert cluster.registry.info(name=NAME, version=2).state == ABORTED
        assert cluster.registry.info(name=NAME, version=1).state == COMMITTED
        assert cluster.registry.latest_committed(name=NAME) == 1
        assert recv.store.get(NAME, 2) is None  # no longer served as a relay either
    finally:
        recv.close()


def test_corrupt_chunk_on_a_relay_is_detected_and_fetched_again(
    cluster: Cluster, transport: Transport
) -> None:
    publisher, relay = cluster.start(("publisher",), ("relay",))
    publisher.send("publish 1")
    publisher.wait("published")
    relay.send("pull 1")
    relay.wait("pulled")
    publisher.wait("committed")
    relay.send("corrupt 5")
    relay.wait("corrupted")

    recv = receiver(cluster, transport)
    try:
        report = recv.pull(1, timeout=30)
        assert_exact(recv, 1)
        assert report.corrupt_chunks == 1
        # Chunk 0 (holding byte 5) came again from the publisher, the rest from the relay.
        assert report.chunks_by_source == {
            relay.address: report.chunks_total - 1,
            publisher.address: 1,
        }
    finally:
        recv.close()


def test_hung_relay_times_out_and_the_pull_completes_elsewhere(
    cluster: Cluster, transport: Transport
) -> None:
    publisher, relay = cluster.start(("publisher",), ("relay",))
    publisher.send("publish 1")
    publisher.wait("published")
    relay.send("pull 1")
    relay.wait("pulled")
    publisher.wait("committed")
    relay.send(f"egress {SLOW}")
    relay.wait("egress")

    recv = receiver(cluster, transport, timeout=0.5)
    result: dict[str, object] = {}
    thread = threading.Thread(target=lambda: result.update(report=recv.pull(1, timeout=30)))
    try:
        thread.start()
        wait_for(lambda: recv.verified_chunks >= 2, 30, "2 chunks from the relay")
        os.kill(relay.proc.pid, signal.SIGSTOP)  # alive but silent: only a timeout can tell
        stopped = time.monotonic()
        thread.join(30)
        assert_exact(recv, 1)
        report = result["report"]
        # The relay is found dead first. On a loaded machine a 0.5 s step against the publisher
        # can time out too; it is then reported dead, and handed out again once it renews.
        assert report.dead_sources[0] == relay.address  # type: ignore[attr-defined]
        assert set(report.dead_sources) <= {relay.address, publisher.address}  # type: ignore[attr-defined]
        assert report.chunks_by_source[publisher.address] > 0  # type: ignore[attr-defined]
        assert time.monotonic() - stopped < 10
    finally:
        thread.join(30)
        recv.close()


def test_publisher_stalled_past_the_step_timeout_during_failover_is_not_lost_for_good(
    cluster: Cluster, transport: Transport
) -> None:
    """A loaded machine: the relay hangs and the publisher, alive, answers too late once.

    The receiver reports both dead to the registry. The publisher of a committed version must be
    handed out again once it shows it lives (it keeps renewing), or the version is lost for
    good. This is the clean-clone flake of the test above, with the publisher's stall made
    deterministic by SIGSTOP instead of left to CPU load.
    """
    publisher, relay = cluster.start(("publisher",), ("relay",))
    publisher.send("publish 1")
    publisher.wait("published")
    relay.send("pull 1")
    relay.wait("pulled")
    publisher.wait("committed")
    relay.send(f"egress {SLOW}")
    relay.wait("egress")

    recv = receiver(cluster, transport, timeout=0.5)
    result: dict[str, object] = {}
    thread = threading.Thread(target=lambda: result.update(report=recv.pull(1, timeout=30)))

    def no_source_left() -> bool:
        try:
            cluster.registry.assign_source(
                name=NAME, version=1, receiver="observer", exclude=(recv.address,), relays=True
            )
        except NoSourceError:
            return True
        cluster.registry.release_source(name=NAME, version=1, receiver="observer")
        return False

    try:
        thread.start()
        wait_for(lambda: recv.verified_chunks >= 2, 30, "2 chunks from the relay")
        os.kill(publisher.proc.pid, signal.SIGSTOP)
        os.kill(relay.proc.pid, signal.SIGSTOP)
        wait_for(no_source_left, 20, "the receiver to report relay and publisher dead")
        os.kill(publisher.proc.pid, signal.SIGCONT)
        thread.join(30)
        report = result["report"]
        assert_exact(recv, 1)
        assert report.dead_sources[0] == relay.address  # type: ignore[attr-defined]
        assert publisher.address in report.dead_sources  # type: ignore[attr-defined]
        assert report.chunks_by_source[publisher.address] > 0  # type: ignore[attr-defined]
    finally:
        os.kill(publisher.proc.pid, signal.SIGCONT)
        thread.join(30)
        recv.close()


def test_requests_that_timed_out_on_a_stopped_source_leave_the_receiver_sound(
    cluster: Cluster, transport: Transport
) -> None:
    """Six connects to a frozen publisher time out; once it thaws, a pull from it is exact.

    ucx: a connect that timed out used to cancel ucxx's handshake, whose reply buffer was then
    freed while still posted; the thawed peer's reply was written into freed memory and the
    process died of SIGSEGV a moment later.
    """
    publisher, relay = cluster.start(("publisher",), ("relay",))
    publisher.send("publish 1")
    publisher.wait("published")
    relay.send("pull 1")
    relay.wait("pulled")
    publisher.wait("committed")
    os.kill(publisher.proc.pid, signal.SIGSTOP)
    try:
        for _ in range(6):
            with (
                pytest.raises(TransferTimeout),
                SourceSession(transport, publisher.address, timeout=0.5) as session,
            ):
                session.manifest(NAME, 1)
    finally:
        os.kill(publisher.proc.pid, signal.SIGCONT)
    recv = receiver(cluster, transport, use_relays=False)
    try:
        report = recv.pull(1, timeout=30)
        assert_exact(recv, 1)
        assert report.chunks_by_source == {publisher.address: report.chunks_total}
    finally:
        recv.close()


def test_hung_only_source_raises_transfer_timeout_and_keeps_live_weights(
    cluster: Cluster, transport: Transport
) -> None:
    publisher, relay = cluster.start(("publisher", "--lease-s", "30"), ("relay",))
    publisher.send("publish 1")
    publisher.wait("published")
    relay.send("pull 1")
    relay.wait("pulled")
    publisher.wait("committed")
    recv = receiver(cluster, transport, timeout=0.5)
    try:
        recv.pull(1, timeout=30)
        relay.kill()
        publisher.send("publish 2")
        publisher.wait("published")
        os.kill(publisher.proc.pid, signal.SIGSTOP)  # lease 30 s: not aborted, just hung
        started = time.monotonic()
        with pytest.raises(TransferTimeout):
            recv.pull(2, timeout=3)
        assert time.monotonic() - started < 6
        assert recv.live_version == 1
        assert_exact(recv, 1)
    finally:
        recv.close()


def test_shm_segments_of_a_killed_relay_are_swept() -> None:
    cluster = Cluster("shm")
    try:
        _check_sweep(cluster, ShmTransport(sweep=False))
    finally:
        cluster.close()


def _check_sweep(cluster: Cluster, shm: ShmTransport) -> None:
    publisher, relay = cluster.start(("publisher",), ("relay",))
    publisher.send("publish 1")
    publisher.wait("published")
    relay.send("pull 1")
    relay.wait("pulled")
    mine = sorted(p.name for p in shm.shm_dir.glob(f"{shm.prefix}-{relay.proc.pid}-*"))
    assert len(mine) == 2  # its two receive slots
    relay.kill()
    removed = shm.sweep_stale()
    assert set(mine) <= set(removed)
    assert not list(shm.shm_dir.glob(f"{shm.prefix}-{relay.proc.pid}-*"))
    # The live publisher's segment is left alone.
    assert list(shm.shm_dir.glob(f"{shm.prefix}-{publisher.proc.pid}-*"))
