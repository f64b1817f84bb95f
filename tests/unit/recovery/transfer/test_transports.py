from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from recovery.transfer import TransferConfigError, TransportUnavailableError, make_transport
from recovery.transfer.errors import ProtocolError
from recovery.transfer.manifest import TensorSpec, byte_view
from recovery.transfer.shm import ShmTransport


def test_make_transport_by_name_and_bad_names() -> None:
    assert make_transport().name == "tcp"
    with pytest.raises(TransferConfigError, match="unknown transport 'rdma'"):
        make_transport("rdma")
    with pytest.raises(TransferConfigError, match="tcp transport takes no options"):
        make_transport("tcp", speed=1)


def test_ucx_is_unavailable_with_a_clear_message_exactly_when_ucxx_is_missing() -> None:
    if importlib.util.find_spec("ucxx") is None:
        with pytest.raises(TransportUnavailableError, match=r"'ucx' extra .*ucxx"):
            make_transport("ucx")
    else:
        assert make_transport("ucx").name == "ucx"


def test_shm_buffers_are_readable_by_another_mapping(tmp_path: Path) -> None:
    shm = ShmTransport(shm_dir=tmp_path)
    specs = [
        TensorSpec("a", "bfloat16", (3, 5)),
        TensorSpec("b", "int64", (7,)),
        TensorSpec("e", "float32", (0,)),
    ]
    buffers = shm.allocate(specs, tag="policy/slot 0")
    buffers.tensors["a"].copy_(torch.randn(3, 5).to(torch.bfloat16))
    buffers.tensors["b"].copy_(torch.arange(7))
    reader = shm.open_payload(buffers.extra)
    try:
        dest = torch.empty(7, dtype=torch.int64)
        reader.read_into(byte_view(dest), "b", 0)
        assert torch.equal(dest, torch.arange(7))
        half = torch.empty(15, dtype=torch.bfloat16)
        reader.read_into(byte_view(half)[:10], "a", 20)
        assert torch.equal(half[:5], buffers.tensors["a"].reshape(-1)[10:15])
        with pytest.raises(ProtocolError, match="no tensor 'zzz'"):
            reader.read_into(byte_view(dest), "zzz", 0)
        with pytest.raises(ProtocolError, match="past the segment"):
            reader.read_into(byte_view(dest), "b", 1 << 20)
    finally:
        reader.close()
        buffers.release()
    assert not list(tmp_path.iterdir())


def test_shm_refuses_segment_names_from_peers_outside_its_prefix(tmp_path: Path) -> None:
    shm = ShmTransport(shm_dir=tmp_path)
    for extra in (
        {"shm_path": "../etc/passwd", "offsets": {}, "size": 1},
        {"shm_path": "other-1-x", "offsets": {}, "size": 1},
        {"shm_path": "rlg-xfer-1-x", "offsets": [], "size": 1},
    ):
        with pytest.raises(ProtocolError, match="bad shared-memory location"):
            shm.open_payload(extra)
    with pytest.raises(ProtocolError, match="does not exist"):
        shm.open_payload({"shm_path": "rlg-xfer-1-gone", "offsets": {}, "size": 1})


def test_shm_bad_configuration_is_named(tmp_path: Path) -> None:
    with pytest.raises(TransferConfigError, match="is not a directory"):
        ShmTransport(shm_dir=tmp_path / "missing")
    with pytest.raises(TransferConfigError, match="prefix"):
        ShmTransport(shm_dir=tmp_path, prefix="a/b")


def test_sweep_removes_only_segments_of_dead_processes(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead_pid = int(dead.stdout)
    (tmp_path / f"rlg-xfer-{dead_pid}-policy_v1_abc").write_bytes(b"x")
    (tmp_path / f"rlg-xfer-{os.getpid()}-policy_v1_def").write_bytes(b"x")
    (tmp_path / "unrelated").write_bytes(b"x")
    removed = ShmTransport(shm_dir=tmp_path, sweep=False).sweep_stale()
    assert removed == [f"rlg-xfer-{dead_pid}-policy_v1_abc"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"rlg-xfer-{os.getpid()}-policy_v1_def", "unrelated"]
    )
