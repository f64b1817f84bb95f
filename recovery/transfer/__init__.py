"""Weight transfer between trainer and rollout workers, with relays and failover.

The trainer publishes a named version of tensors (:class:`WeightPublisher`); rollout workers pull
it (:class:`WeightReceiver`) from whichever source a :class:`SourceRegistry` hands out, verify
every chunk, and relay what they hold. Transports: ``tcp`` (default), ``shm``, ``ucx``.
"""

from recovery.transfer.config import TRANSPORTS, make_transport
from recovery.transfer.errors import (
    ChunkChecksumError,
    ManifestMismatchError,
    NonContiguousTensorError,
    NoSourceError,
    PeerDeadError,
    ProtocolError,
    TransferConfigError,
    TransferError,
    TransferTimeout,
    TransportUnavailableError,
    UnknownVersionError,
    VersionDiscardedError,
)
from recovery.transfer.manifest import TensorSpec, WeightManifest, build_manifest
from recovery.transfer.publisher import Publication, WeightPublisher
from recovery.transfer.receiver import PullReport, WeightReceiver
from recovery.transfer.registry import InMemoryRegistry, SourceRegistry, VersionInfo
from recovery.transfer.registry_net import RegistryClient, RegistryServer
from recovery.transfer.reshard import TensorParallelLayout, reshard
from recovery.transfer.transport import Transport

__all__ = [
    "TRANSPORTS",
    "ChunkChecksumError",
    "InMemoryRegistry",
    "ManifestMismatchError",
    "NoSourceError",
    "NonContiguousTensorError",
    "PeerDeadError",
    "ProtocolError",
    "Publication",
    "PullReport",
    "RegistryClient",
    "RegistryServer",
    "SourceRegistry",
    "TensorParallelLayout",
    "TensorSpec",
    "TransferConfigError",
    "TransferError",
    "TransferTimeout",
    "Transport",
    "TransportUnavailableError",
    "UnknownVersionError",
    "VersionDiscardedError",
    "VersionInfo",
    "WeightManifest",
    "WeightPublisher",
    "WeightReceiver",
    "build_manifest",
    "make_transport",
    "reshard",
]
