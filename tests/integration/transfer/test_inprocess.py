"""Publisher, receiver and the networked registry in one process, over loopback sockets."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import torch

from recovery.transfer import (
    InMemoryRegistry,
    ManifestMismatchError,
    NonContiguousTensorError,
    NoSourceError,
    RegistryClient,
    RegistryServer,
    TensorSpec,
    TransferConfigError,
    UnknownVersionError,
    VersionDiscardedError,
    WeightPublisher,
    WeightReceiver,
    make_transport,
)
from recovery.transfer.errors import ProtocolError
from recovery.transfer.registry import COMMITTED
from recovery.transfer.tcp import TcpTransport
from recovery.transfer.wire import recv_message, send_message
from tests.harness import wait_for
from tests.integration.transfer.weights import NAME, make_weights, same_bits, specs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
def net_registry() -> Iterator[tuple[InMemoryRegistry, RegistryClient]]:
    registry = InMemoryRegistry()
    server = RegistryServer(registry)
    client = RegistryClient(server.address, timeout=5)
    yield registry, client
    client.close()
    server.close()


def test_registry_client_maps_calls_and_typed_errors(
    net_registry: tuple[InMemoryRegistry, RegistryClient],
) -> None:
    local, client = net_registry
    client.begin(name="p", version=4, manifest_digest="abc", publisher="T:1", lease_s=5)
    client.announce(name="p", version=4, address="R:1", complete=True)
    assert (
        client.assign_source(name="p", version=4, receiver="X:1", exclude=[], relays=True) == "R:1"
    )
    assert client.info(name="p", version=4).complete_sources == 2
    client.commit(name="p", version=4)
    assert local.info(name="p", version=4).state == COMMITTED
    assert client.latest_committed(name="p") == 4
    with pytest.raises(UnknownVersionError, match="'p' v9"):
        client.info(name="p", version=9)
    with pytest.raises(TransferConfigError, match="not newer"):
        client.begin(name="p", version=3, manifest_digest="x", publisher="T:1", lease_s=5)
    client.begin(name="p", version=5, manifest_digest="y", publisher="T:1", lease_s=5)
    client.abort(name="p", version=5, reason="test")
    with pytest.raises(VersionDiscardedError, match="test"):
        client.assign_source(name="p", version=5, receiver="X:1", exclude=[], relays=True)


def test_registry_server_answers_garbage_without_dying(
    net_registry: tuple[InMemoryRegistry, RegistryClient],
) -> None:
    _, client = net_registry
    channel = TcpTransport().connect(client.address, timeout=5)
    try:
        send_message(channel, {"op": "__init__", "kwargs": {}}, timeout=5)
        assert recv_message(channel, timeout=5)["error"] == "TransferConfigError"
        send_message(channel, {"op": "info", "kwargs": {"bogus": 1}}, timeout=5)
        assert "bogus" in recv_message(channel, timeout=5)["detail"]
    finally:
        channel.close()
    assert client.latest_committed(name="nothing") is None


def test_pipelined_fan_out_and_second_version_alternate_slots() -> None:
    registry = InMemoryRegistry()
    transport = make_transport("tcp")
    publisher = WeightPublisher(NAME, transport=transport, registry=registry, chunk_bytes=8 << 10)
    receivers = [
        WeightReceiver(NAME, specs(), transport=transport, registry=registry) for _ in range(4)
    ]
    try:
        for version in (1, 2, 3):
            publication = publisher.publish(version, make_weights(0, version))
            threads = [
                threading.Thread(target=r.pull, args=(version,), kwargs={"timeout": 30})
                for r in receivers
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            publication.wait_committed(timeout=5)
            for r in receivers:
                assert r.live_version == version
                assert all(
                    same_bits(r.live_tensors[k], v) for k, v in make_weights(0, version).items()
                )
        # Receivers keep relaying the live and the previous version; v1's slot was reused for v3.
        assert [sorted(r.store.stats()) for r in receivers] == [[f"{NAME}@2", f"{NAME}@3"]] * 4
    finally:
        for r in receivers:
            r.close()
        publisher.close()


def test_a_committed_publisher_reported_dead_is_handed_out_again_while_it_serves() -> None:
    """A receiver that timed out on a loaded publisher reports it dead; its renewals undo that.

    Without renewals after the commit the report stood for good: with no relay left the version
    could not be fetched although its publisher still served it (the clean-clone flake of
    test_hung_relay_times_out_and_the_pull_completes_elsewhere[ucx]).
    """
    registry = InMemoryRegistry()
    transport = make_transport("tcp")
    publisher = WeightPublisher(NAME, transport=transport, registry=registry, lease_s=0.3)
    receiver = WeightReceiver(NAME, specs(), transport=transport, registry=registry)
    try:
        publication = publisher.publish(1, make_weights(0, 1))
        try:
            receiver.pull(1, timeout=30)
            publication.wait_committed(timeout=5)
        finally:
            receiver.close()  # the only relay is gone
        registry.withdraw(name=NAME, version=1, address=receiver.address)
        registry.report_dead(name=NAME, version=1, address=publisher.address)

        def publisher_assigned() -> bool:
            try:
                source = registry.assign_source(
                    name=NAME, version=1, receiver="R:9", exclude=(), relays=True
                )
            except NoSourceError:
                return False
            registry.release_source(name=NAME, version=1, receiver="R:9")
            return source == publisher.address

        wait_for(publisher_assigned, 10, "the publisher to be handed out again")
        # Retired, it stops renewing (its publish thread ends), and a report of its death stands.
        publisher.retire(1)
        wait_for(
            lambda: not any(t.name == f"publish-{NAME}-v1" for t in threading.enumerate()),
            10,
            "the renewals of the retired version to stop",
        )
        registry.announce(name=NAME, version=1, address=publisher.address, complete=True)
        registry.report_dead(name=NAME, version=1, address=publisher.address)
        assert not publisher_assigned()
    finally:
        publisher.close()


def test_receiver_and_publisher_reject_bad_input_and_change_nothing() -> None:
    registry = InMemoryRegistry()
    transport = make_transport("tcp")
    publisher = WeightPublisher(
        NAME, transport=transport, registry=registry, noncontiguous="refuse"
    )
    recv = WeightReceiver(NAME, specs(), transport=transport, registry=registry, timeout=1)
    try:
        weights = make_weights(0, 1)
        with pytest.raises(NonContiguousTensorError, match="'mlp.fp32'"):
            publisher.publish(1, weights)
        with pytest.raises(TransferConfigError, match="min_replicas"):
            publisher.publish(1, {k: v.contiguous() for k, v in weights.items()}, min_replicas=0)
        assert publisher.store.stats() == {}
        with pytest.raises(
            TransferConfigError, match="bytes_per_s must be positive or None, got -1"
        ):
            publisher.server.set_egress_limit(-1)
        with pytest.raises(UnknownVersionError):
            registry.info(name=NAME, version=1)

        with pytest.raises(TransferConfigError, match="version must be"):
            recv.pull(-1)
        with pytest.raises(TransferConfigError, match="timeout must be positive"):
            recv.pull(1, timeout=0)
        with pytest.raises(ManifestMismatchError, match="'attn.fp16'"):
            recv.load_initial(0, {**make_weights(0, 0), "attn.fp16": torch.zeros(3)})
        recv.load_initial(5, {k: v.contiguous() for k, v in make_weights(0, 5).items()})
        with pytest.raises(TransferConfigError, match="not newer than live v5"):
            recv.pull(5)
        assert recv.live_version == 5
        with pytest.raises(TransferConfigError, match="max_chunk_attempts"):
            WeightReceiver(
                NAME, specs(), transport=transport, registry=registry, max_chunk_attempts=0
            )
        with pytest.raises(TransferConfigError, match="name each tensor once"):
            WeightReceiver(NAME, specs() + specs()[:1], transport=transport, registry=registry)
    finally:
        recv.close()
        publisher.close()


def test_manifest_that_does_not_fit_the_receivers_buffers_fails_fast() -> None:
    registry = InMemoryRegistry()
    transport = make_transport("tcp")
    publisher = WeightPublisher(NAME, transport=transport, registry=registry)
    wrong = [TensorSpec("embed.bf16", "float32", (256, 96))] + specs()[1:]
    recv = WeightReceiver(NAME, wrong, transport=transport, registry=registry, timeout=1)
    try:
        publisher.publish(1, make_weights(0, 1))
        started = time.monotonic()
        with pytest.raises(ManifestMismatchError, match="'embed.bf16'.*bfloat16.*float32"):
            recv.pull(1, timeout=20)
        assert time.monotonic() - started < 5
        assert recv.live_version is None
    finally:
        recv.close()
        publisher.close()


def test_unknown_version_without_any_source_times_out_cleanly() -> None:
    registry = InMemoryRegistry()
    transport = make_transport("tcp")
    recv = WeightReceiver(NAME, specs(), transport=transport, registry=registry, timeout=0.2)
    try:
        with pytest.raises(UnknownVersionError):
            recv.pull(3, timeout=1)
        assert recv.store.stats() == {}
    finally:
        recv.close()


def test_manifest_from_a_source_that_disagrees_with_the_registry_is_not_used() -> None:
    registry = InMemoryRegistry()
    transport = make_transport("tcp")
    honest = WeightPublisher(NAME, transport=transport, registry=registry)
    liar_registry = InMemoryRegistry()  # the liar publishes different bytes under the same version
    liar = WeightPublisher(NAME, transport=transport, registry=liar_registry)
    recv = WeightReceiver(NAME, specs(), transport=transport, registry=registry, timeout=1)
    try:
        honest.publish(1, make_weights(0, 1))
        liar.publish(1, make_weights(9, 1))
        registry.announce(
            name=NAME, version=1, address=liar.address, complete=True
        )  # preferred relay
        report = recv.pull(1, timeout=20)
        assert report.chunks_by_source == {honest.address: report.chunks_total}
        assert same_bits(recv.live_tensors["embed.bf16"], make_weights(0, 1)["embed.bf16"])
    finally:
        recv.close()
        liar.close()
        honest.close()


def test_protocol_error_type_is_exported() -> None:
    assert issubclass(ProtocolError, Exception)
