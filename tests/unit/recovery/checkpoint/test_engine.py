from __future__ import annotations

import math
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from recovery.checkpoint import atomic, engine
from recovery.checkpoint.engine import CheckpointEngine
from recovery.checkpoint.errors import (
    CheckpointBusy,
    CheckpointCorrupt,
    CheckpointInputError,
    CheckpointWriteError,
)
from recovery.checkpoint.version import VersionVector, WeightVersionTable
from recovery.errors import RecoveryTimeout
from tests.harness.training_state import assert_same, small_training_state

pytestmark = pytest.mark.timeout(60)
V = VersionVector


def _save(eng: CheckpointEngine, state: dict[str, Any], step: int) -> engine.CheckpointInfo:
    return eng.save(state, version=V(step, step // 2)).wait(30)


@pytest.fixture(params=["sha256", "crc32"])
def eng(tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    e = CheckpointEngine(tmp_path / "ckpt", keep=3, checksum=request.param)
    yield e
    e.close()


def test_round_trip_of_real_training_state_is_bit_exact(eng: CheckpointEngine) -> None:
    state = small_training_state()
    table = WeightVersionTable()
    table.record(1, 1)
    table.record(3, 2)
    info = eng.save(state, version=V(3, 2), weight_versions=table).wait(30)
    latest = eng.latest()
    assert latest is not None and latest.path == info.path
    assert latest.version == V(3, 2) and latest.weight_versions == table
    assert_same(state, eng.load(latest))


def test_unusual_values_round_trip(eng: CheckpointEngine) -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    odd = {
        "noncontiguous": base.t(),
        "offset_view": base.reshape(-1)[5:17],  # contiguous, but not at its storage's start
        "conj": torch.complex(torch.randn(3), torch.randn(3)).conj(),  # lazily conjugated
        "neg": torch._neg_view(torch.randn(4)),  # lazily negated, contiguous
        "parameter": torch.nn.Parameter(torch.randn(4)),
        "bf16": torch.randn(5).to(torch.bfloat16),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(7, dtype=torch.int64),
        "empty": torch.empty(0, 3),
        "int_keys": {0: "a", 1: (2, 3.5), (1, "x"): None},
        "floats": [math.inf, -math.inf, math.nan, 1e-300],
        "bytes": b"\x00\xff",
        "dtype": torch.float16,
        "__reserved": 1,
    }
    state = {**small_training_state(), "rollout_stats": odd}
    info = eng.save(state, version=V(1, 1)).wait(30)
    loaded = eng.load(info)
    assert_same(state, loaded)
    stats = loaded["rollout_stats"]
    assert stats["noncontiguous"].is_contiguous()
    assert not stats["conj"].is_conj() and not stats["neg"].is_neg()
    assert torch.equal(stats["conj"], odd["conj"].resolve_conj())
    assert torch.equal(stats["neg"], odd["neg"].resolve_neg())


def test_save_blocks_only_for_the_copy(eng: CheckpointEngine) -> None:
    state = small_training_state()
    expected = {k: v.clone() for k, v in state["model"].items()}
    handle = eng.save(state, version=V(3, 1))
    # Training continues right away and mutates the live tensors; the checkpoint must not see it.
    for t in state["model"].values():
        t.add_(1000.0)
    info = handle.wait(30)
    assert handle.done and handle.error is None
    assert_same(expected, eng.load(info)["model"])


def test_layers_and_transient(eng: CheckpointEngine) -> None:
    state = {
        **small_training_state(),
        "experience_buffer": {"tokens": torch.arange(10), "policy_version": [1, 1, 2]},
        "kv_cache": torch.zeros(1000),
        "request_queue": ["r1"],
    }
    info = eng.save(state, version=V(3, 1)).wait(30)
    assert info.layers["aux"] == ["experience_buffer"]
    assert info.transient == ["kv_cache", "request_queue"]
    assert "kv_cache" not in info.components
    core_only = eng.load(info, layers=["core"])
    assert set(core_only) == set(engine.DEFAULT_REQUIRED_CORE)
    both = eng.load(info)
    assert_same(state["experience_buffer"], both["experience_buffer"])
    with pytest.raises(CheckpointInputError, match="transient"):
        eng.load(info, layers=["transient"])


def test_retention_keeps_newest(eng: CheckpointEngine) -> None:
    state = small_training_state()
    for step in range(1, 6):
        _save(eng, {**state, "step": step}, step)
    eng.close()
    names = [p.name for p in eng.list_committed()]
    assert names == ["ckpt-0000000003", "ckpt-0000000004", "ckpt-0000000005"]
    latest = eng.latest()
    assert latest is not None and eng.load(latest)["step"] == 5


def _damage_flip(path: Path) -> None:
    data = bytearray((path / "core.bin").read_bytes())
    data[len(data) // 2] ^= 0x01
    (path / "core.bin").write_bytes(bytes(data))


def _damage_truncate(path: Path) -> None:
    with open(path / "core.bin", "r+b") as fh:
        fh.truncate(100)


def _damage_marker(path: Path) -> None:
    (path / engine.MARKER).unlink()


def _damage_manifest(path: Path) -> None:
    (path / engine.MANIFEST).write_bytes(b"{}")


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_damage_flip, "checksum mismatch in core.bin"),
        (_damage_truncate, "core.bin is 100 bytes"),
        (_damage_marker, "no COMMITTED marker"),
        (_damage_manifest, "manifest.json is 2 bytes"),
    ],
)
def test_corrupt_newest_falls_back_to_previous(
    eng: CheckpointEngine, damage: Any, reason: str
) -> None:
    state = small_training_state()
    first = _save(eng, {**state, "step": 1}, 1)
    second = _save(eng, {**state, "step": 2}, 2)
    damage(second.path)
    latest = eng.latest()
    assert latest is not None and latest.path == first.path
    assert [s.name for s in latest.skipped] == [second.path.name]
    assert reason in latest.skipped[0].reason
    assert eng.load(latest)["step"] == 1
    # Loading the damaged one directly is refused too, never returns partial data.
    with pytest.raises(CheckpointCorrupt):
        eng.load(second)


def test_damage_after_latest_is_caught_by_load(eng: CheckpointEngine) -> None:
    _save(eng, small_training_state(), 1)
    info = eng.latest()
    assert info is not None and set(info.verified) == {"core.bin", "manifest.json"}
    _damage_flip(info.path)
    with pytest.raises(CheckpointCorrupt, match="checksum mismatch"):
        eng.load(info, verify="full")


def test_if_changed_rehashes_files_touched_since_latest(eng: CheckpointEngine) -> None:
    _save(eng, small_training_state(), 1)
    info = eng.latest()
    assert info is not None
    eng.load(info)  # untouched: trusted from latest()'s hash
    core = info.path / "core.bin"
    damaged = bytearray(core.read_bytes())
    damaged[7] ^= 0xFF
    replacement = info.path / "core.new"
    replacement.write_bytes(bytes(damaged))
    os.replace(replacement, core)  # a rewrite: new inode
    with pytest.raises(CheckpointCorrupt, match="checksum mismatch in core.bin"):
        eng.load(info)
    fresh = eng.latest()
    assert fresh is None
    with pytest.raises(CheckpointInputError, match="verify must be"):
        eng.load(info, verify="sometimes")  # type: ignore[arg-type]


def test_in_place_edit_with_new_mtime_is_rehashed(eng: CheckpointEngine) -> None:
    _save(eng, small_training_state(), 1)
    info = eng.latest()
    assert info is not None
    core = info.path / "core.bin"
    before = core.stat()
    _damage_flip(info.path)
    os.utime(core, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
    with pytest.raises(CheckpointCorrupt, match="checksum mismatch"):
        eng.load(info)
    assert eng.load(info, verify="none")["step"] == 3  # sizes only: the caller's explicit choice


def test_valid_only_false_returns_newest_with_a_marker(eng: CheckpointEngine) -> None:
    state = small_training_state()
    _save(eng, state, 1)
    second = _save(eng, state, 2)
    _damage_flip(second.path)
    unchecked = eng.latest(valid_only=False)
    assert unchecked is not None and unchecked.path == second.path


def test_no_checkpoint_gives_none(eng: CheckpointEngine) -> None:
    assert eng.latest() is None


@pytest.mark.parametrize(
    ("state", "kwargs", "message"),
    [
        ({"model": {}}, {}, "core components missing"),
        ({**small_training_state(), "mystery": 1}, {}, "'mystery' has no layer"),
        (
            small_training_state(),
            {"layers": {**engine.DEFAULT_LAYERS, "step": "gold"}},
            "unknown layer 'gold'",
        ),
        (
            {**small_training_state(), "rollout_stats": {"f": object()}},
            {},
            "rollout_stats.f: cannot checkpoint",
        ),
        (
            {**small_training_state(), "rollout_stats": [torch.zeros(2).to_sparse()]},
            {},
            "rollout_stats[0]: only dense",
        ),
        ({}, {}, "non-empty mapping"),
        (small_training_state(), {"version": (1, 2)}, "VersionVector"),
        (small_training_state(), {"weight_versions": {1: 1}}, "WeightVersionTable"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(
    eng: CheckpointEngine, state: Any, kwargs: dict[str, Any], message: str
) -> None:
    kwargs = {"version": V(1, 1), **kwargs}
    with pytest.raises(CheckpointInputError) as exc:
        eng.save(state, **kwargs)
    assert message in str(exc.value)
    assert eng.list_committed() == []
    assert list(eng.root.iterdir()) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"keep": 0}, "keep must be"),
        ({"when_busy": "queue"}, "when_busy must be"),
        ({"checksum": "md5"}, "checksum must be one of"),
    ],
)
def test_bad_engine_options(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(CheckpointInputError, match=message):
        CheckpointEngine(tmp_path, **kwargs)


@pytest.fixture
def gated_writes(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Hold every background file write until the test opens the gate."""
    gate = threading.Event()
    real = atomic.write_file_durable

    def held(path: Path, data: Any, **kw: Any) -> atomic.FileDigest:
        assert gate.wait(30)
        return real(path, data, **kw)

    monkeypatch.setattr(atomic, "write_file_durable", held)
    return gate


def test_second_save_refused_while_writing(tmp_path: Path, gated_writes: threading.Event) -> None:
    eng = CheckpointEngine(tmp_path, when_busy="refuse")
    state = small_training_state()
    first = eng.save(state, version=V(1, 1))
    assert not first.done
    with pytest.raises(CheckpointBusy, match="still being written"):
        eng.save(state, version=V(2, 1))
    gated_writes.set()
    assert first.wait(30).seq == 1
    first.wait_finished(30)
    assert eng.save(state, version=V(2, 1)).wait(30).seq == 2
    eng.close()


def test_second_save_waits_with_timeout(tmp_path: Path, gated_writes: threading.Event) -> None:
    eng = CheckpointEngine(tmp_path, when_busy="wait")
    state = small_training_state()
    first = eng.save(state, version=V(1, 1))
    with pytest.raises(RecoveryTimeout, match="nothing was saved"):
        eng.save(state, version=V(2, 1), timeout=0.2)
    with pytest.raises(RecoveryTimeout):
        first.wait(0.05)
    threading.Timer(0.2, gated_writes.set).start()
    second = eng.save(state, version=V(2, 1), timeout=30)
    assert first.done and second.wait(30).seq == 2
    eng.close()
    assert [p.name for p in eng.list_committed()] == ["ckpt-0000000001", "ckpt-0000000002"]


def test_failed_write_is_reported_and_leaves_no_checkpoint(
    eng: CheckpointEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = _save(eng, small_training_state(), 1)

    def disk_full(path: Path, data: Any, **kw: Any) -> atomic.FileDigest:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic, "write_file_durable", disk_full)
    handle = eng.save(small_training_state(), version=V(2, 1))
    with pytest.raises(CheckpointWriteError, match="No space left"):
        handle.wait(30)
    assert isinstance(handle.error, OSError)
    assert eng.latest() == good
    assert [p.name for p in eng.root.iterdir() if p.name.startswith(".tmp")] == []


def test_one_writer_per_root(tmp_path: Path) -> None:
    a = CheckpointEngine(tmp_path)
    b = CheckpointEngine(tmp_path, lock_timeout=0.2)
    state = small_training_state()
    a.save(state, version=V(1, 1)).wait(30)
    with pytest.raises(RecoveryTimeout, match="another process is saving"):
        b.save(state, version=V(2, 1))
    a.close()
    assert b.save(state, version=V(2, 1)).wait(30).seq == 2
    b.close()


def test_stale_tmp_dirs_are_removed_by_next_writer(tmp_path: Path) -> None:
    (tmp_path / ".tmp-ckpt-0000000001-dead").mkdir()
    (tmp_path / "ckpt-0000000001").mkdir()  # renamed but never marked: a writer died here
    eng = CheckpointEngine(tmp_path)
    assert eng.latest() is None and eng.last_skipped[0].name == "ckpt-0000000001"
    info = eng.save(small_training_state(), version=V(1, 1)).wait(30)
    eng.close()
    assert info.seq == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [".writer.lock", "ckpt-0000000002"]


@pytest.mark.parametrize("checksum", ["sha256", "crc32"])
def test_mirror_gets_a_verified_copy_and_retention(tmp_path: Path, checksum: str) -> None:
    eng = CheckpointEngine(
        tmp_path / "local",
        keep=2,
        mirror=tmp_path / "remote",
        checksum=checksum,  # type: ignore[arg-type]
    )
    state = small_training_state()
    for step in range(1, 4):
        handle = eng.save({**state, "step": step}, version=V(step, 1))
        handle.wait(30)
        handle.wait_finished(30)
        assert handle.mirror_error is None
    remote = eng.latest(root=tmp_path / "remote")
    assert remote is not None and remote.seq == 3
    assert eng.load(remote)["step"] == 3
    assert sorted(p.name for p in (tmp_path / "remote").iterdir()) == [
        "ckpt-0000000002",
        "ckpt-0000000003",
    ]
    eng.close()
    with pytest.raises(CheckpointInputError, match="same directory"):
        CheckpointEngine(tmp_path / "local", mirror=tmp_path / "local")


def test_marker_records_the_chosen_checksum(eng: CheckpointEngine) -> None:
    info = _save(eng, small_training_state(), 1)
    assert set(info.files["core.bin"]) == {"size", eng.checksum}


def test_reader_racing_writer_and_retention_never_sees_wrong_data(tmp_path: Path) -> None:
    writer = CheckpointEngine(tmp_path, keep=1)
    reader = CheckpointEngine(tmp_path)
    base = small_training_state()
    stop = threading.Event()
    problems: list[str] = []
    loads = 0

    def read_loop() -> None:
        nonlocal loads
        while not stop.is_set():
            info = reader.latest()  # must never raise, even while retention deletes
            if info is None:
                continue
            try:
                got = reader.load(info)
            except CheckpointCorrupt:
                continue  # deleted under us (keep=1): refused, never partial
            if got["step"] != info.version.training_step:
                problems.append(f"{info.path.name}: step {got['step']} != {info.version}")
            loads += 1

    thread = threading.Thread(target=read_loop)
    thread.start()
    try:
        for step in range(1, 20):
            writer.save({**base, "step": step}, version=V(step, 0)).wait(30)
    finally:
        stop.set()
        thread.join(30)
        writer.close()
    assert problems == [] and loads > 0


def test_preallocate_reserves_buffers_the_save_then_reuses(eng: CheckpointEngine) -> None:
    state = {**small_training_state(), "experience_buffer": torch.ones(100)}
    sizes = eng.preallocate(state)
    assert set(sizes) == {"core", "aux"} and sizes["aux"] >= 400
    buffers = {k: v.data_ptr() for k, v in eng._buffers.items()}
    info = eng.save(state, version=V(3, 1)).wait(30)
    assert {k: v.data_ptr() for k, v in eng._buffers.items()} == buffers
    assert_same(state, eng.load(info))
    assert eng.list_committed() == [info.path]
    with pytest.raises(CheckpointInputError, match="core components missing"):
        eng.preallocate({"model": {}})
