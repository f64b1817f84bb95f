"""integrations/trl/_generation_store.py on a real write-ahead log: the keys, the attempts after
a batch was found unusable, a record torn by a kill and a data file that does not match its
checksum (never returned as a batch), completion and compaction, and a directory that cannot
be used."""

from __future__ import annotations

from pathlib import Path

import pytest

from integrations import IntegrationError
from integrations.trl._generation_store import (
    COMPACT_EVERY,
    Cadence,
    GenerationStore,
    entry_id,
    parse_entry_id,
)
from recovery.wal import WALDataError, WALStatus

pytestmark = pytest.mark.timeout(60)


def test_cadence_keys_and_the_last_step_that_consumes_a_generation() -> None:
    every_step = Cadence(grad_accum=1, steps_per_generation=1, num_iterations=1)
    assert every_step.key(0) == (1, 0) and every_step.key(3) == (4, 0)
    assert every_step.last_step(4, 0) == 4
    # One generation for two optimizer steps: made in step 3, consumed by steps 3 and 4.
    buffered = Cadence(grad_accum=1, steps_per_generation=2, num_iterations=1)
    assert buffered.generation_start(3) == 2 and buffered.key(2) == (3, 0)
    assert buffered.last_step(3, 0) == 4
    # Two micro-steps per optimizer step, one generation each: indexes 0 and 1 of one step.
    accumulated = Cadence(grad_accum=2, steps_per_generation=1, num_iterations=1)
    assert [accumulated.key(m) for m in range(4)] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert accumulated.micro_step(2, 1) == 3 and accumulated.last_step(2, 1) == 2
    # Reused for two iterations over two accumulation steps: one generation per step.
    iterated = Cadence(grad_accum=2, steps_per_generation=1, num_iterations=2)
    assert iterated.generation_start(3) == 2 and iterated.last_step(2, 0) == 2


def test_entry_ids_round_trip() -> None:
    assert entry_id(12, 1) == "gen-00000012-001"
    assert entry_id(12, 1, 2) == "gen-00000012-001-r2"
    assert parse_entry_id("gen-00000012-001-r2") == (12, 1, 2)
    assert parse_entry_id("gen-00000012-001") == (12, 1, 0)
    assert parse_entry_id("rollout-1") is None


def test_a_batch_is_logged_read_back_and_a_second_attempt_gets_its_own_id(tmp_path: Path) -> None:
    store = GenerationStore(tmp_path / "wal", sync=False)
    first = store.log(4, 0, b"batch of step 4")
    assert first.entry_id == "gen-00000004-000" and first.status is WALStatus.PENDING
    assert store.read(first) == b"batch of step 4"
    store.fail(first, "it was generated for other prompts")
    again = store.log(4, 0, b"batch of step 4, again")
    assert again.entry_id == "gen-00000004-000-r1"
    latest = store.latest(4, 0)
    assert latest is not None and latest.entry_id == again.entry_id
    assert [e.entry_id for e in store.pending()] == [again.entry_id]
    assert store.latest(5, 0) is None
    store.close()


def test_a_data_file_that_does_not_match_its_checksum_is_never_read(tmp_path: Path) -> None:
    store = GenerationStore(tmp_path / "wal", sync=False)
    entry = store.log(4, 0, b"batch of step 4")
    assert entry.data_path is not None
    damaged = bytearray(entry.data_path.read_bytes())
    damaged[0] ^= 0xFF
    entry.data_path.write_bytes(bytes(damaged))
    with pytest.raises(WALDataError, match="gen-00000004-000.*checksum"):
        store.read(entry)
    entry.data_path.write_bytes(b"batch of st")  # a partial file
    with pytest.raises(WALDataError, match="checksum"):
        store.read(entry)
    store.close()


def test_a_record_torn_by_a_kill_is_gone_when_the_log_is_opened_again(tmp_path: Path) -> None:
    store = GenerationStore(tmp_path / "wal", sync=False)
    store.log(3, 0, b"batch of step 3")
    store.log(4, 0, b"batch of step 4")
    store.close()
    # The last record loses its end, as a process killed mid-write leaves it (the segment is
    # preallocated with zeros: the record ends at the last non-zero byte).
    (segment,) = (tmp_path / "wal").glob("wal-*.log")
    data = bytearray(segment.read_bytes())
    end = len(data.rstrip(b"\0"))
    data[end - 6 : end] = bytes(6)
    segment.write_bytes(bytes(data))
    reopened = GenerationStore(tmp_path / "wal", sync=False)
    assert reopened.latest(4, 0) is None  # never offered
    kept = reopened.latest(3, 0)
    assert kept is not None and reopened.read(kept) == b"batch of step 3"
    reopened.close()


def test_completed_batches_are_compacted_away_with_their_files(tmp_path: Path) -> None:
    store = GenerationStore(tmp_path / "wal", sync=False)
    ids = [store.log(step, 0, b"x" * 64).entry_id for step in range(1, COMPACT_EVERY + 2)]
    store.complete(ids[:-1])
    assert [e.entry_id for e in store.wal.entries()] == ids[-1:]
    assert len(list((tmp_path / "wal" / "data").iterdir())) == 1
    store.close()


def test_a_directory_that_is_a_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "generations"
    path.write_text("not a directory", encoding="utf-8")
    with pytest.raises(IntegrationError, match=f"generation log directory {path} is not a dir"):
        GenerationStore(path)
    (tmp_path / "parent").write_text("a file", encoding="utf-8")
    below = tmp_path / "parent" / "rank-0"
    with pytest.raises(IntegrationError, match=f"generation log directory {below} cannot be used"):
        GenerationStore(below)
