"""The spool: order, identity across restarts, exact drop accounting, crash safety."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from pathlib import Path

import orjson
import pytest

from agents.spool import Spool, SpoolError


def gpu(i: int) -> dict:
    return {
        "name": "gpu_temperature_celsius",
        "value": 50.0 + i,
        "ts": 1.0 + i,
        "labels": {"gpu": "0"},
    }


def job(i: int) -> dict:
    return {
        "name": "train_step",
        "value": float(i),
        "ts": 1.0 + i,
        "labels": {"job": "j", "role": "trainer", "rank": "0"},
    }


def body(n_gpu: int, n_job: int, participants: int = 0) -> dict:
    return {
        "agent_id": "x",
        "node": "n1",
        "samples": [gpu(i) for i in range(n_gpu)] + [job(i) for i in range(n_job)],
        "participants": [
            {"job": "j", "role": "trainer", "rank": i, "phase": "TRAIN", "step": 1, "ts": 1.0}
            for i in range(participants)
        ],
        "fingerprint": None,
    }


def accounting_holds(sp: Spool) -> None:
    st = sp.stats()
    assert st.produced_samples == st.acked_samples + sum(st.dropped.values()) + st.samples


def test_seq_order_and_acknowledge(tmp_path: Path) -> None:
    sp = Spool(tmp_path, node="n1", max_bytes=10**9)
    seqs = [sp.append(body(2, 1)) for _ in range(3)]
    assert seqs == [0, 1, 2]
    assert sp.agent_id.startswith("n1-")
    seq, raw = sp.wait_oldest(0)  # type: ignore[misc]
    assert seq == 0 and orjson.loads(raw)["seq"] == 0
    sp.unpin()
    assert sp.wait_oldest(0)[0] == 0  # type: ignore[index]  # a failed delivery keeps the order
    assert sp.acknowledge(0) == 3
    assert sp.wait_oldest(0)[0] == 1  # type: ignore[index]
    assert sp.acknowledge(1, rejected=True) == 3
    st = sp.stats()
    assert (st.batches, st.samples, st.acked_samples, st.dropped["rejected"]) == (1, 3, 3, 3)
    accounting_holds(sp)


def test_wait_oldest_times_out_on_empty_spool(tmp_path: Path) -> None:
    sp = Spool(tmp_path, node="n1", max_bytes=10**9)
    start = time.monotonic()
    assert sp.wait_oldest(0.2) is None
    assert time.monotonic() - start >= 0.15


def test_identity_and_seq_survive_restart_even_when_empty(tmp_path: Path) -> None:
    sp = Spool(tmp_path, node="n1", max_bytes=10**9)
    for _ in range(5):
        sp.acknowledge(sp.append(body(1, 0)))
    agent_id = sp.agent_id
    again = Spool(tmp_path, node="n1", max_bytes=10**9)
    assert again.agent_id == agent_id
    assert again.append(body(1, 0)) > 4  # never reuses a seq the server may have seen


def test_full_spool_drops_oldest_gpu_samples_first_then_whole_batches(tmp_path: Path) -> None:
    one = len(orjson.dumps({**body(20, 2), "seq": 0}))
    sp = Spool(tmp_path, node="n1", max_bytes=one * 5, fsync=False)
    for _ in range(8):
        sp.append(body(20, 2))
    st = sp.stats()
    assert st.bytes <= one * 5
    assert st.batches == 8  # stripping GPU samples from the oldest made room
    assert st.dropped["spool_full"] % 20 == 0 and st.dropped["spool_full"] > 0
    # the oldest batches lost their GPU samples, kept their job signals; the newest are whole
    first = orjson.loads(sp.wait_oldest(0)[1])  # type: ignore[index]
    sp.unpin()
    assert [s["name"] for s in first["samples"]] == ["train_step", "train_step"]
    newest = orjson.loads((tmp_path / "batches" / f"{7:020d}.json").read_bytes())
    assert len(newest["samples"]) == 22
    accounting_holds(sp)
    # keep going: eventually only job signals remain and whole batches go, oldest first
    for _ in range(200):
        sp.append(body(20, 2, participants=1))
    st = sp.stats()
    assert st.bytes <= one * 5
    assert sp.wait_oldest(0)[0] > 0  # type: ignore[index]
    accounting_holds(sp)


def test_job_signals_only_dropped_when_no_gpu_sample_is_left(tmp_path: Path) -> None:
    job_only = len(orjson.dumps({**body(0, 30), "seq": 0}))
    sp = Spool(tmp_path, node="n1", max_bytes=job_only * 3 + 200)
    for _ in range(3):
        sp.append(body(0, 30))
    sp.append(body(50, 0))  # a GPU-heavy batch that does not fit
    st = sp.stats()
    # its own GPU samples were dropped rather than any older job signal
    assert st.dropped["spool_full"] == 50
    assert st.samples == 90
    accounting_holds(sp)


def test_pinned_batch_is_never_trimmed_under_the_sender(tmp_path: Path) -> None:
    one = len(orjson.dumps({**body(20, 0), "seq": 0}))
    sp = Spool(tmp_path, node="n1", max_bytes=one * 2)
    sp.append(body(20, 0))
    seq, raw = sp.wait_oldest(0)  # type: ignore[misc]
    for _ in range(5):
        sp.append(body(20, 0))
    assert (tmp_path / "batches" / f"{seq:020d}.json").read_bytes() == raw
    assert sp.acknowledge(seq) == 20  # acknowledged whole: nothing counted twice
    accounting_holds(sp)


def test_leftover_temp_file_removed_and_corrupt_file_set_aside(tmp_path: Path) -> None:
    sp = Spool(tmp_path, node="n1", max_bytes=10**9)
    sp.append(body(1, 1))
    (tmp_path / "batches" / ".00000000000000000001.json.tmp").write_bytes(b'{"half')
    (tmp_path / "batches" / f"{5:020d}.json").write_bytes(b"garbage")
    again = Spool(tmp_path, node="n1", max_bytes=10**9)
    assert again.stats().batches == 1
    names = sorted(p.name for p in (tmp_path / "batches").iterdir())
    assert names == [f"{0:020d}.json", f"corrupt-{5:020d}.json"]


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(SpoolError, match="-1"):
        Spool(tmp_path, node="n1", max_bytes=-1)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SpoolError, match="not writable"):
        Spool(blocker / "sub", node="n1", max_bytes=1000)


def test_unreadable_state_starts_a_new_identity_and_keeps_the_spooled_batches(
    tmp_path: Path,
) -> None:
    sp = Spool(tmp_path, node="n1", max_bytes=10**9)
    old_id = sp.agent_id
    for _ in range(3):
        sp.append({**body(1, 1), "agent_id": old_id})
    (tmp_path / "state.json").write_bytes(b"")  # as after a power loss
    again = Spool(tmp_path, node="n1", max_bytes=10**9)
    assert again.agent_id != old_id
    assert (tmp_path / "state.json.corrupt").exists()
    seq, raw = again.wait_oldest(0)  # type: ignore[misc]
    assert orjson.loads(raw)["agent_id"] == old_id and seq == 0  # replayed under its own identity
    assert again.append(body(1, 0)) == 3


def _append_forever(directory: str) -> None:
    sp = Spool(Path(directory), node="n1", max_bytes=10**9)
    while True:
        sp.append(body(3, 2))


@pytest.mark.timeout(120)
def test_kill_9_while_appending_leaves_a_clean_ordered_spool(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")  # no inherited threads or locks
    rng = random.Random(7)
    highest = -1
    for kills in range(1, 13):
        proc = ctx.Process(target=_append_forever, args=(str(tmp_path),))
        proc.start()
        time.sleep(rng.uniform(0.05, 0.3))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        sp = Spool(tmp_path, node="n1", max_bytes=10**9)
        seqs = []
        while (item := sp.wait_oldest(0)) is not None:
            seq, raw = item
            doc = orjson.loads(raw)  # every surviving file is a whole batch
            assert doc["seq"] == seq and len(doc["samples"]) == 5
            seqs.append(seq)
            sp.acknowledge(seq)
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        assert not seqs or seqs[0] > highest
        if seqs:
            highest = seqs[-1]
        highest = sp.append(body(1, 0))
        assert highest > max(seqs, default=-1)
        sp.acknowledge(highest)
        sp.close()
        st = sp.stats()
        # a kill between a batch file and the counters can miss the count of that one batch
        assert 0 <= st.acked_samples - st.produced_samples <= 5 * kills


def test_job_signals_not_dropped_while_the_pinned_batch_still_has_gpu_samples(
    tmp_path: Path,
) -> None:
    full = len(orjson.dumps({**body(40, 2), "seq": 0}))
    sp = Spool(tmp_path, node="n1", max_bytes=full + 400)
    sp.append(body(40, 2))
    pinned, _raw = sp.wait_oldest(0)  # type: ignore[misc]
    for _ in range(4):
        sp.append(body(40, 2))
    st = sp.stats()
    # every unpinned batch lost its GPU samples, but no job signal was dropped
    assert st.samples == 40 + 5 * 2
    assert st.dropped["spool_full"] == 4 * 40
    sp.unpin()
    sp.append(body(40, 2))  # now the formerly pinned batch is trimmed, and the newest too
    st = sp.stats()
    assert st.dropped["spool_full"] == 6 * 40
    assert st.samples == 6 * 2
    accounting_holds(sp)


def test_disk_full_loses_the_round_counted_and_the_spool_stays_usable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    import agents.spool as spool_module

    sp = Spool(tmp_path, node="n1", max_bytes=10**9)
    sp.append(body(2, 1))
    real = spool_module.replace_file

    def full(path: Path, data: bytes, *, sync: bool = True) -> None:
        if path.parent.name == "batches":
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data, sync=sync)

    monkeypatch.setattr(spool_module, "replace_file", full)
    with pytest.raises(SpoolError, match="No space left"):
        sp.append(body(4, 1))
    monkeypatch.setattr(spool_module, "replace_file", real)
    sp.append(body(1, 1))
    st = sp.stats()
    assert st.dropped["spool_write_failed"] == 5
    assert st.batches == 2
    accounting_holds(sp)


def test_agent_id_fits_the_servers_identifier_limit(tmp_path: Path) -> None:
    sp = Spool(tmp_path, node="n" * 128, max_bytes=1000)
    assert len(sp.agent_id) <= 128 and sp.agent_id.startswith("n" * 115 + "-")
