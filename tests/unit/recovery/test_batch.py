"""Atomic batch commit: complete batches only, idempotent, debris cleaned up."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from recovery.batch import (
    BatchConflictError,
    BatchError,
    CommittedBatch,
    cleanup_uncommitted,
    commit_batch,
    committed_batches,
)
from recovery.errors import RecoveryError

pytestmark = pytest.mark.timeout(60)

META = {"worker_id": "rollout-3", "seed": 1234, "token_count": 900}


def _samples(n: int, tag: str = "x") -> list[dict[str, object]]:
    return [{"prompt": f"p{i}", "response": f"{tag}{i}", "reward": i / 10} for i in range(n)]


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>"
        for p in sorted(root.rglob("*"))
        if p.name != ".commit.lock"
    }


def test_commit_writes_samples_meta_and_marker(tmp_path: Path) -> None:
    path = commit_batch(tmp_path, "batch_0001", _samples(5), meta=META)
    assert path == tmp_path / "batch_0001"
    assert sorted(os.listdir(path)) == ["SUCCESS", "meta.json", "samples.jsonl"]
    assert (path / "SUCCESS").read_bytes() == b""
    meta = json.loads((path / "meta.json").read_text())
    assert meta["worker_id"] == "rollout-3" and meta["seed"] == 1234
    assert meta["token_count"] == 900 and meta["complete"] is True
    assert meta["sample_count"] == 5 and isinstance(meta["timestamp"], float)
    lines = (path / "samples.jsonl").read_text().splitlines()
    assert [json.loads(line)["response"] for line in lines] == [f"x{i}" for i in range(5)]
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]


def test_committed_batches_lists_only_complete_intact_batches(tmp_path: Path) -> None:
    commit_batch(tmp_path, "b1", _samples(3), meta=META)
    commit_batch(tmp_path, "b2", _samples(4), meta=META)
    # a batch renamed in but never marked (writer killed before SUCCESS)
    unmarked = tmp_path / "b3"
    unmarked.mkdir()
    (unmarked / "samples.jsonl").write_text('{"a": 1}\n')
    # a marked batch whose samples were damaged afterwards
    commit_batch(tmp_path, "b4", _samples(2), meta=META)
    with (tmp_path / "b4" / "samples.jsonl").open("a") as handle:
        handle.write('{"extra": true}\n')
    found = list(committed_batches(tmp_path))
    assert [b.batch_id for b in found] == ["b1", "b2"]
    assert found[1].load_samples() == json.loads(json.dumps(_samples(4)))
    assert found[0].meta["sample_count"] == 3


def test_load_samples_rechecks_content(tmp_path: Path) -> None:
    commit_batch(tmp_path, "b1", _samples(3), meta=META)
    (batch,) = committed_batches(tmp_path)
    (tmp_path / "b1" / "samples.jsonl").write_text('{"swapped": 1}\n{"a": 2}\n{"b": 3}\n')
    with pytest.raises(BatchError, match="sha256"):
        batch.load_samples()


def test_committing_the_same_batch_twice_is_idempotent(tmp_path: Path) -> None:
    first = commit_batch(tmp_path, "b1", _samples(3), meta=META)
    before = _tree(tmp_path)
    again = commit_batch(tmp_path, "b1", _samples(3), meta=dict(META))
    assert again == first
    assert _tree(tmp_path) == before


def test_different_content_under_the_same_id_is_refused(tmp_path: Path) -> None:
    commit_batch(tmp_path, "b1", _samples(3), meta=META)
    before = _tree(tmp_path)
    with pytest.raises(BatchConflictError, match="'b1' is already committed"):
        commit_batch(tmp_path, "b1", _samples(3, tag="y"), meta=META)
    with pytest.raises(BatchConflictError):
        commit_batch(tmp_path, "b1", _samples(3), meta={**META, "seed": 5})
    assert _tree(tmp_path) == before


def test_unmarked_leftover_is_replaced_by_a_new_commit(tmp_path: Path) -> None:
    leftover = tmp_path / "b1"
    leftover.mkdir()
    (leftover / "samples.jsonl").write_text("half")
    commit_batch(tmp_path, "b1", _samples(2), meta=META)
    assert [b.batch_id for b in committed_batches(tmp_path)] == ["b1"]


def test_cleanup_removes_debris_but_keeps_batches_and_live_writers(tmp_path: Path) -> None:
    import socket

    commit_batch(tmp_path, "good", _samples(2), meta=META)
    (tmp_path / "unmarked").mkdir()
    dead = tmp_path / f".tmp-b9.{socket.gethostname()}.999999999.abcd"
    dead.mkdir()
    other_host = tmp_path / ".tmp-b8.some-other-host.1.abcd"
    other_host.mkdir()
    live = tmp_path / f".tmp-b7.{socket.gethostname()}.{os.getpid()}.abcd"
    live.mkdir()
    removed = cleanup_uncommitted(tmp_path)
    assert sorted(p.name for p in removed) == sorted([dead.name, other_host.name, "unmarked"])
    assert live.exists() and (tmp_path / "good" / "SUCCESS").exists()
    assert [b.batch_id for b in committed_batches(tmp_path)] == ["good"]
    assert cleanup_uncommitted(tmp_path / "missing") == []


@pytest.mark.parametrize(
    ("batch_id", "samples", "meta", "message"),
    [
        ("", _samples(1), META, "batch_id '' is not a valid name"),
        ("../escape", _samples(1), META, "'../escape' is not a valid name"),
        (".hidden", _samples(1), META, "not a valid name"),
        ("a/b", _samples(1), META, "not a valid name"),
        (7, _samples(1), META, "batch_id 7"),
        ("b", [], META, "must not be empty"),
        ("b", "text", META, "must be a list of objects"),
        ("b", [{"ok": 1}, 5], META, "sample 1 is int"),
        ("b", [{"bad": object()}], META, "sample 0 is not JSON-serializable"),
        ("b", [{"nan": float("nan")}], META, "sample 0 is not JSON-serializable"),
        ("b", _samples(1), {"seed": 1, "token_count": 1}, "worker_id must be a non-empty string"),
        ("b", _samples(1), {**META, "seed": "7"}, "seed must be an int, got '7'"),
        ("b", _samples(1), {**META, "token_count": -1}, "token_count must be an int >= 0, got -1"),
        ("b", _samples(1), {**META, "complete": False}, "meta keys \\['complete'\\]"),
        ("b", _samples(1), {**META, "extra": {1, 2}}, "meta is not JSON-serializable"),
        ("b", _samples(1), ["not", "a", "mapping"], "meta must be a mapping"),
    ],
)
def test_bad_input_is_refused_and_writes_nothing(
    tmp_path: Path, batch_id: object, samples: object, meta: object, message: str
) -> None:
    root = tmp_path / "root"
    with pytest.raises(BatchError, match=message) as info:
        commit_batch(root, batch_id, samples, meta=meta)  # type: ignore[arg-type]
    assert isinstance(info.value, RecoveryError)
    assert not root.exists()


def test_unwritable_root_is_a_batch_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(BatchError, match="cannot commit batch 'b1'"):
        commit_batch(blocker / "root", "b1", _samples(1), meta=META)


def test_committed_batch_is_a_value(tmp_path: Path) -> None:
    commit_batch(tmp_path, "b1", _samples(1), meta=META)
    (batch,) = committed_batches(tmp_path)
    assert isinstance(batch, CommittedBatch) and batch.path == tmp_path / "b1"
