"""kill -9 a process that appends to the WAL at random moments; check what survived.

After every kill: the log opens cleanly, every acknowledged append is present with its last
acknowledged status (or the status of the one change that was in flight), data files of
acknowledged appends match their checksums, and no entry appears that nobody appended.
"""

from __future__ import annotations

import hashlib
import os
import random
import select
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from recovery.wal import WALStatus, WriteAheadLog

from ._harness import ChildRun, Reporter, assert_killed, run_and_kill, run_many_and_kill

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

SEGMENT_BYTES = 4096


def _data_for(entry_id: str) -> bytes:
    return hashlib.sha256(entry_id.encode()).digest() * 40


def _writer(
    directory: Path, prefix: str, seed: int, *, compact: bool
) -> Callable[[Reporter], None]:
    def child(report: Reporter) -> None:
        rng = random.Random(seed)
        wal = WriteAheadLog(directory, segment_bytes=SEGMENT_BYTES)
        live = [e.entry_id for e in wal.recover() if e.entry_id.startswith(prefix)]
        n = 0
        while True:
            roll = rng.random()
            if roll < 0.4 or not live:
                eid = f"{prefix}{seed}-{n}"
                n += 1
                with_data = rng.random() < 0.25
                report.begin(f"append {eid} {int(with_data)}")
                wal.append(eid, "generate", data=_data_for(eid) if with_data else None)
                report.ack(f"append {eid} {int(with_data)}")
                live.append(eid)
            elif roll < 0.97 or not compact:
                eid = rng.choice(live)
                status = rng.choice(["executing", "completed", "failed", "pending", "completed"])
                report.begin(f"status {eid} {status}")
                wal.update_status(eid, status)
                report.ack(f"status {eid} {status}")
                if status == "completed":
                    live.remove(eid)
            else:
                report.begin("compact")
                wal.compact()
                report.ack("compact")

    return child


@dataclass
class Model:
    """What the log must contain: acknowledged status and whether it has data, per entry."""

    status: dict[str, WALStatus] = field(default_factory=dict)
    has_data: dict[str, bool] = field(default_factory=dict)
    acked_ops: int = 0

    def apply(self, op: str) -> None:
        verb, *args = op.split(" ")
        if verb == "batch":  # append_many: "batch id,id,..."
            for eid in args[0].split(","):
                self.status[eid] = WALStatus.PENDING
                self.has_data[eid] = False
        elif verb == "statuses":  # update_many: "statuses id:status,..."
            self.status.update(_changes(args[0]))
        elif verb == "append":
            self.status[args[0]] = WALStatus.PENDING
            self.has_data[args[0]] = args[1] == "1"
        elif verb == "status":
            self.status[args[0]] = WALStatus(args[1])
        else:
            for eid in [k for k, v in self.status.items() if v is WALStatus.COMPLETED]:
                del self.status[eid]

    def absorb(self, run: ChildRun) -> None:
        for op in run.acked:
            self.apply(op)
        self.acked_ops += len(run.acked)


def _changes(spec: str) -> list[tuple[str, WALStatus]]:
    pairs = [item.split(":") for item in spec.split(",")]
    return [(eid, WALStatus(status)) for eid, status in pairs]


def _verify(directory: Path, model: Model, in_flight: list[str]) -> None:
    """Check the reopened log against the model, then fold in the in-flight ops that landed."""
    with WriteAheadLog(directory, segment_bytes=SEGMENT_BYTES) as wal:
        found = {e.entry_id: e.status for e in wal.entries()}
        order = [e.entry_id for e in wal.recover()]
        landed: list[str] = []
        allowed_extra: set[str] = set()
        alternatives: dict[str, WALStatus] = {}
        compact_in_flight = False
        for op in in_flight:
            verb, *args = op.split(" ")
            if verb == "batch":  # one record: every entry of it landed, or none
                ids = args[0].split(",")
                allowed_extra.update(ids)
                present = [eid in found for eid in ids]
                assert all(present) or not any(present), f"half a batch landed: {present}"
                if all(present):
                    assert all(found[eid] is WALStatus.PENDING for eid in ids)
                    landed.append(op)
            elif verb == "statuses":  # all of the changes, or none
                before = {eid: model.status[eid] for eid, _ in _changes(args[0])}
                after = dict(before)
                after.update(_changes(args[0]))
                seen = {eid: found.get(eid) for eid in before}
                assert seen in (before, after), f"half a batch of changes: {seen}"
                if seen == after != before:
                    landed.append(op)
                for eid in before:
                    alternatives[eid] = after[eid]
            elif verb == "append":
                allowed_extra.add(args[0])
                if args[0] in found:
                    assert found[args[0]] is WALStatus.PENDING
                    landed.append(op)
            elif verb == "status":
                alternatives[args[0]] = WALStatus(args[1])
                if found.get(args[0]) is WALStatus(args[1]) is not model.status.get(args[0]):
                    landed.append(op)
            else:
                compact_in_flight = True
        assert set(found) <= set(model.status) | allowed_extra, (
            f"invented entries: {set(found) - set(model.status) - allowed_extra}"
        )
        completed = [k for k, v in model.status.items() if v is WALStatus.COMPLETED]
        if compact_in_flight and completed and completed[0] not in found:
            landed.append("compact")  # the compaction was atomic: all of them went, or none
            assert not any(k in found for k in completed)
        for eid, status in model.status.items():
            if eid in completed and "compact" in landed:
                continue
            assert eid in found, f"acknowledged entry {eid} is missing"
            assert found[eid] in {status, alternatives.get(eid, status)}, (
                f"{eid}: found {found[eid]}, acknowledged {status}"
            )
            if model.has_data.get(eid):
                assert wal.read_data(eid) == _data_for(eid)
        # recover() lists the non-completed entries in append order
        assert order == [k for k, v in found.items() if v is not WALStatus.COMPLETED]
    for op in landed:
        model.apply(op)
        if op.startswith("append") and op.endswith(" 1"):
            with WriteAheadLog(directory) as wal:
                assert wal.read_data(op.split(" ")[1]) == _data_for(op.split(" ")[1])


def _kill_repeatedly(
    directory: Path,
    child: Callable[[int], Callable[[Reporter], None]],
    *,
    kills: int,
    seed: int,
    window: tuple[float, float],
    after_kill: Callable[[ChildRun], None] | None = None,
) -> Model:
    """Run ``child(kill)`` and SIGKILL it ``kills`` times, a random time within ``window``
    seconds after it starts; after each kill, check the log against what was acknowledged."""
    rng = random.Random(seed)
    model = Model()
    for kill in range(kills):
        run = run_and_kill(
            child(kill),
            kill_after=rng.uniform(*window),
            from_first_report=kill % 10 != 0,  # every 10th kill may land while opening the log
        )
        assert_killed(run)
        model.absorb(run)
        _verify(directory, model, [run.in_flight] if run.in_flight else [])
        if after_kill is not None:
            after_kill(run)
    return model


def test_single_writer_killed_120_times(tmp_path: Path) -> None:
    model = _kill_repeatedly(
        tmp_path,
        lambda kill: _writer(tmp_path, "w-", seed=kill, compact=True),
        kills=120,
        seed=20261129,
        window=(0.005, 0.08),
    )
    assert model.acked_ops > 120, f"too few operations before the kills: {model.acked_ops}"


def test_two_concurrent_writers_killed_50_times_each(tmp_path: Path) -> None:
    """Two processes share the log (and its group commit); both are killed at random."""
    rng = random.Random(7)
    model = Model()
    for round_no in range(50):
        runs = run_many_and_kill(
            [
                _writer(tmp_path, "a-", seed=round_no, compact=False),
                _writer(tmp_path, "b-", seed=round_no, compact=False),
            ],
            [rng.uniform(0.01, 0.08), rng.uniform(0.01, 0.08)],
            from_first_report=round_no % 10 != 0,
        )
        for run in runs:
            assert_killed(run)
            model.absorb(run)
        _verify(tmp_path, model, [r.in_flight for r in runs if r.in_flight])
    assert model.acked_ops > 100, f"too few operations before the kills: {model.acked_ops}"


def _batch_writer(directory: Path, seed: int) -> Callable[[Reporter], None]:
    """Append entries in groups and change their statuses in groups (append_many,
    update_many): every group is one record."""

    def child(report: Reporter) -> None:
        rng = random.Random(seed)
        wal = WriteAheadLog(directory, segment_bytes=SEGMENT_BYTES)
        live = [e.entry_id for e in wal.recover()]
        n = 0
        while True:
            if rng.random() < 0.5 or len(live) < 3:
                ids = [f"m{seed}-{n + i}" for i in range(rng.randint(2, 5))]
                n += len(ids)
                op = "batch " + ",".join(ids)
                report.begin(op)
                wal.append_many([(eid, "generate") for eid in ids])
                report.ack(op)
                live.extend(ids)
            else:
                picked = rng.sample(live, k=rng.randint(1, 3))
                changes = [(e, rng.choice(["executing", "failed", "completed"])) for e in picked]
                op = "statuses " + ",".join(f"{e}:{s}" for e, s in changes)
                report.begin(op)
                wal.update_many(changes)
                report.ack(op)
                live = [e for e in live if (e, "completed") not in changes]

    return child


def test_batch_writer_killed_60_times(tmp_path: Path) -> None:
    """A group of entries or of status changes is one record: after a kill at any moment it
    is there whole or not at all, and every acknowledged group is there."""
    model = _kill_repeatedly(
        tmp_path,
        lambda kill: _batch_writer(tmp_path, kill),
        kills=60,
        seed=31,
        window=(0.005, 0.06),
    )
    assert model.acked_ops > 60, f"too few operations before the kills: {model.acked_ops}"


def _compactor(directory: Path, seed: int) -> Callable[[Reporter], None]:
    """Complete some entries, add new ones and compact, over and over."""

    def child(report: Reporter) -> None:
        rng = random.Random(seed)
        wal = WriteAheadLog(directory, segment_bytes=SEGMENT_BYTES)
        n = 0
        while True:
            live = [e.entry_id for e in wal.recover()]
            for eid in rng.sample(live, k=min(len(live), 3)):
                report.begin(f"status {eid} completed")
                wal.update_status(eid, "completed")
                report.ack(f"status {eid} completed")
            for _ in range(3):
                eid = f"c{seed}-{n}"
                with_data = n % 3 == 0
                n += 1
                report.begin(f"append {eid} {int(with_data)}")
                wal.append(eid, "update", data=_data_for(eid) if with_data else None)
                report.ack(f"append {eid} {int(with_data)}")
            report.begin("compact")
            wal.compact(orphan_grace_s=0)
            report.ack("compact")

    return child


def test_killed_during_compaction_40_times(tmp_path: Path) -> None:
    """Compaction swaps segments atomically: a kill at any moment loses no live entry."""
    compactions = 0

    def check_data_files(run: ChildRun) -> None:
        nonlocal compactions
        compactions += sum(op == "compact" for op in run.acked)
        with WriteAheadLog(tmp_path, segment_bytes=SEGMENT_BYTES) as wal:
            for entry in wal.recover():
                if entry.checksum is not None:
                    assert wal.read_data(entry.entry_id) == _data_for(entry.entry_id)

    _kill_repeatedly(
        tmp_path,
        lambda kill: _compactor(tmp_path, kill),
        kills=40,
        seed=5,
        window=(0.02, 0.15),
        after_kill=check_data_files,
    )
    assert compactions > 20, f"too few compactions before the kills: {compactions}"


def _threaded_child(directory: Path, seed: int, threads: int, report_fd: int) -> None:
    """Several threads of one process append and update their own entries through one handle
    (their records are written and synced in combined batches); each line on the pipe says
    which thread began or finished which operation."""
    wal = WriteAheadLog(directory, segment_bytes=SEGMENT_BYTES)
    send_lock = threading.Lock()

    def send(line: str) -> None:
        data = (line + "\n").encode()
        with send_lock:  # one write() of < PIPE_BUF bytes is atomic; keep the lines whole
            os.write(report_fd, data)

    def run(thread: int) -> None:
        rng = random.Random(seed * 100 + thread)
        prefix = f"t{thread}-{seed}-"
        live: list[str] = []
        n = 0
        while True:
            if rng.random() < 0.45 or not live:
                eid = f"{prefix}{n}"
                n += 1
                with_data = rng.random() < 0.2
                op = f"append {eid} {int(with_data)}"
                send(f"B {thread} {op}")
                wal.append(eid, "generate", data=_data_for(eid) if with_data else None)
                live.append(eid)
            else:
                eid = rng.choice(live)
                status = rng.choice(["executing", "completed", "failed", "pending"])
                op = f"status {eid} {status}"
                send(f"B {thread} {op}")
                wal.update_status(eid, status)
                if status == "completed":
                    live.remove(eid)
            send(f"A {thread} {op}")

    workers = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def test_threaded_writer_killed_40_times(tmp_path: Path) -> None:
    """A process with 4 appender threads (combined writes, shared syncs) is killed at random:
    every call any thread saw return is in the log with its acknowledged status."""
    rng = random.Random(11)
    model = Model()
    threads = 4
    for kill in range(40):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child never returns into pytest
            os.close(read_fd)
            try:
                _threaded_child(tmp_path, kill, threads, write_fd)
            finally:
                os._exit(3)
        os.close(write_fd)
        try:
            readable, _, _ = select.select([read_fd], [], [], 30)
            assert readable, "the child reported nothing"
            time.sleep(rng.uniform(0.01, 0.08))
        finally:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
        chunks = []
        while chunk := os.read(read_fd, 65536):
            chunks.append(chunk)
        os.close(read_fd)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
        in_flight: dict[str, str] = {}
        acked: list[str] = []
        for line in b"".join(chunks).decode().splitlines():
            kind, thread, op = line.split(" ", 2)
            if kind == "B":
                in_flight[thread] = op
            else:
                assert in_flight.pop(thread) == op
                acked.append(op)
        model.absorb(ChildRun(acked=acked))
        _verify(tmp_path, model, list(in_flight.values()))
    assert model.acked_ops > 200, f"too few operations before the kills: {model.acked_ops}"
