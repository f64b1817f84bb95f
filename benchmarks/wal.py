"""Write-ahead log throughput and overhead, each against a baseline measured in the same run.

(a) one writer: WAL appends/s vs a raw loop of ``write`` + ``fsync`` of records of the same size
    (target >= 0.85x);
(b) 4 writer processes: WAL records/s vs the straightforward design (lock, write, fsync per
    record) (target >= 5x);
(c) the same 4 writer processes vs SQLite in WAL mode with ``synchronous=FULL``, one commit per
    row (target >= 5x);
(d) the WAL's overhead on a simulated rollout loop (a 50 ms sleep per step producing 4
    records) (target < 5 %).

First a line measures this disk: write+sync of one record with fsync/fdatasync of a growing
file (what the baselines pay) and with fdatasync/RWF_DSYNC into a preallocated one (what the
WAL pays). Every writer in (b)/(c) opens its files before the clock starts and then calls in a
tight loop, each call returning only once its records are durable. So with one thread per
process and one record per call at most 4 records can share a sync. (b) and (c) run three
shapes: one thread per process and one record per call; ``--threads`` appender threads per
process (the baselines get the same threads); and one thread per process logging each
rollout step's ``--step-records`` records with one ``append_many`` call (a step of the loop in
(d) produces 4 records), against the same baselines, which write and commit every record on
its own (the designs the issue names). Each shape prints what bounds it, measured in the same
run: the WAL without any fsync (what the CPUs allow with this WAL), every outstanding record in
every sync of the measured mean duration (sharing syncs), and every thread syncing a
preallocated file of its own with no log at all, as many records per sync as one call holds
(parallel syncs). When both ways of using the disk stay under 5x the baseline, no design
reaches the target on that machine; when only the WAL's own CPU cost does, this WAL is what
falls short.

    .venv/bin/python benchmarks/wal.py            # default sizes, well under 2 minutes
    .venv/bin/python benchmarks/wal.py --records 4000 --per-writer 400 --steps 100
"""

from __future__ import annotations

import argparse
import fcntl
import multiprocessing
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.synchronize import Barrier
from pathlib import Path

from recovery.wal import WriteAheadLog

# The record format, on purpose: the raw baseline writes records as long as the WAL's own.
from recovery.wal._format import scan

_CTX = multiprocessing.get_context("fork")


def _entry_id(writer: int, thread: int, i: int) -> str:
    return f"rollout-w{writer:02d}-t{thread:02d}-{i:08d}"


# ---------------------------------------------------------------------------- (a) one writer


def one_writer(directory: Path, records: int, block: int) -> tuple[float, float, int, float]:
    """(WAL records/s, raw records/s, record bytes, the WAL's mean seconds per sync).

    The two loops alternate in blocks of ``block`` records so that the load of a shared
    machine, which changes from second to second, weighs on both alike.
    """
    wal_dir = directory / "a-wal"
    wal = WriteAheadLog(wal_dir)
    wal.append(_entry_id(0, 0, 0), "generate")
    segment = next(wal_dir.glob("wal-*.log"))
    record_bytes = scan(segment.read_bytes()).valid_end  # the file holds preallocated zeros
    payload = b"x" * (record_bytes - 1) + b"\n"
    fd = os.open(directory / "a-raw.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    wal_time = raw_time = 0.0
    done = 0
    while done < records:
        n = min(block, records - done)
        start = time.perf_counter()
        for i in range(done, done + n):
            wal.append(_entry_id(0, 1, i), "generate")
        wal_time += time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(n):
            os.write(fd, payload)
            os.fsync(fd)
        raw_time += time.perf_counter() - start
        done += n
    os.close(fd)
    stats = wal.stats()
    wal.close()
    return records / wal_time, records / raw_time, record_bytes, stats.sync_seconds / stats.fsyncs


# ------------------------------------------------------------------ (b)/(c) several processes


@dataclass
class Opened:
    """A writer process's design, opened before the clock starts: ``run(thread)`` writes that
    thread's records, one durable call at a time; ``close()`` returns (fsyncs, sync seconds)
    (the WAL's own counts; the baselines run one fsync per record and report zeros)."""

    run: Callable[[int], None]
    close: Callable[[], tuple[int, float]]


#: (directory, writer, threads, records per thread, records per call) -> Opened. Only the WAL
#: and the private files use the last one; the baselines write and commit each record alone.
Opener = Callable[[Path, int, int, int, int], Opened]


def _open_wal(
    directory: Path,
    writer: int,
    threads: int,
    per_thread: int,
    per_call: int = 1,
    *,
    sync: bool = True,
) -> Opened:
    """Each thread appends ``per_thread`` records, ``per_call`` at a time (one ``append`` or
    one ``append_many``); every call returns once its records are durable."""
    wal = WriteAheadLog(directory, sync=sync)

    def run(thread: int) -> None:
        if per_call == 1:
            for i in range(per_thread):
                wal.append(_entry_id(writer, thread, i), "generate")
            return
        for first in range(0, per_thread, per_call):
            last = min(first + per_call, per_thread)
            wal.append_many(
                [(_entry_id(writer, thread, i), "generate") for i in range(first, last)]
            )

    def close() -> tuple[int, float]:
        stats = wal.stats()
        wal.close()
        return stats.fsyncs, stats.sync_seconds

    return Opened(run, close)


def _open_wal_without_fsync(
    directory: Path, writer: int, threads: int, per_thread: int, per_call: int
) -> Opened:
    """The same appenders with ``sync=False``: what this machine's CPUs allow at best."""
    return _open_wal(directory, writer, threads, per_thread, per_call, sync=False)


def _open_private_files(
    directory: Path, writer: int, threads: int, per_thread: int, per_call: int
) -> Opened:
    """Not a log: every thread writes its records into a file of its own, preallocated,
    ``per_call`` of them with each ``RWF_DSYNC`` write (no lock, no format, no Python beyond
    the loop): how many independent syncs per second this disk takes at once (a design could
    spread its writers over such files instead of sharing syncs)."""
    record = b"x" * 123 + b"\n"
    fds = []
    for thread in range(threads):
        fd = os.open(directory / f"private-{writer}-{thread}", os.O_RDWR | os.O_CREAT, 0o644)
        os.pwrite(fd, bytes(per_thread * len(record)), 0)
        os.fsync(fd)
        fds.append(fd)

    def run(thread: int) -> None:
        fd = fds[thread]
        for first in range(0, per_thread, per_call):
            count = min(per_call, per_thread - first)
            os.pwritev(fd, [record * count], first * len(record), os.RWF_DSYNC)

    def close() -> tuple[int, float]:
        for fd in fds:
            os.close(fd)
        return 0, 0.0

    return Opened(run, close)


def _open_locked_fsync(
    directory: Path, writer: int, threads: int, per_thread: int, per_call: int
) -> Opened:
    """The straightforward design: take the lock, write the record, fsync, release."""
    fd = os.open(directory / "naive.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    lock_fd = os.open(directory / "naive.lock", os.O_RDWR | os.O_CREAT, 0o644)
    mutex = threading.Lock()

    def run(thread: int) -> None:
        for i in range(per_thread):
            record = f'{{"id":"{_entry_id(writer, thread, i)}","t":"generate","s":"pending"}}\n'
            with mutex:
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
                os.write(fd, record.encode())
                os.fsync(fd)
                fcntl.flock(lock_fd, fcntl.LOCK_UN)

    def close() -> tuple[int, float]:
        os.close(fd)
        os.close(lock_fd)
        return 0, 0.0

    return Opened(run, close)


def _open_sqlite(
    directory: Path, writer: int, threads: int, per_thread: int, per_call: int
) -> Opened:
    """One connection per thread, opened in advance; one transaction (and commit) per row."""
    connections = []
    for _ in range(threads):
        db = sqlite3.connect(
            directory / "bench.sqlite", timeout=60, isolation_level=None, check_same_thread=False
        )
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        connections.append(db)

    def run(thread: int) -> None:
        db = connections[thread]
        for i in range(per_thread):
            db.execute("BEGIN IMMEDIATE")
            db.execute(
                "INSERT INTO wal(entry_id, step_type, status) VALUES (?, 'generate', 'pending')",
                (_entry_id(writer, thread, i),),
            )
            db.execute("COMMIT")

    def close() -> tuple[int, float]:
        for db in connections:
            db.close()
        return 0, 0.0

    return Opened(run, close)


def _prepare_sqlite(directory: Path) -> None:
    db = sqlite3.connect(directory / "bench.sqlite", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE wal(entry_id TEXT PRIMARY KEY, step_type TEXT, status TEXT)")
    db.close()


def _run_threads(run: Callable[[int], None], threads: int) -> None:
    workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def _process_main(
    opener: Opener,
    directory: Path,
    writer: int,
    threads: int,
    per_thread: int,
    per_call: int,
    barrier: Barrier,
    out: multiprocessing.Queue[tuple[float, float, int, float]],
) -> None:
    # Opening (files, locks, connections, the WAL's scan) happens before the clock starts, in
    # every design alike: the figures are records per second of writing.
    opened = opener(directory, writer, threads, per_thread, per_call)
    barrier.wait(timeout=60)
    start = time.monotonic()  # CLOCK_MONOTONIC is shared by all processes on Linux
    _run_threads(opened.run, threads)
    end = time.monotonic()
    fsyncs, sync_seconds = opened.close()
    out.put((start, end, fsyncs, sync_seconds))


@dataclass
class Run:
    """What one design did in one round: records, seconds from first start to last end,
    and (WAL only) fsyncs run and seconds spent in them, summed over the processes."""

    records: int
    seconds: float
    fsyncs: int
    sync_seconds: float


def several_writers(
    opener: Opener,
    directory: Path,
    processes: int,
    threads: int,
    per_thread: int,
    per_call: int = 1,
) -> Run:
    """Run ``processes`` writer processes of ``threads`` threads at once."""
    directory.mkdir(parents=True)
    if opener is _open_sqlite:
        _prepare_sqlite(directory)
    if opener in (_open_wal, _open_wal_without_fsync):
        WriteAheadLog(directory).close()  # create the log before the processes start
    barrier = _CTX.Barrier(processes)
    out: multiprocessing.Queue[tuple[float, float, int, float]] = _CTX.Queue()
    procs = [
        _CTX.Process(
            target=_process_main,
            args=(opener, directory, w, threads, per_thread, per_call, barrier, out),
        )
        for w in range(processes)
    ]
    for proc in procs:
        proc.start()
    spans = [out.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
        if proc.exitcode != 0:
            raise RuntimeError(f"writer process failed with exit code {proc.exitcode}")
    elapsed = max(s[1] for s in spans) - min(s[0] for s in spans)
    return Run(
        processes * threads * per_thread,
        elapsed,
        sum(s[2] for s in spans),
        sum(s[3] for s in spans),
    )


# ------------------------------------------------------------------ sync costs of this disk


def sync_costs(directory: Path, records: int, block: int) -> dict[str, list[float]]:
    """Seconds per write+sync of one 124-byte record, for four ways of syncing, interleaved
    in blocks: fsync and fdatasync of a growing (appended) file, which must commit the new
    size and blocks through the file system journal, and fdatasync and an ``RWF_DSYNC`` write
    into a segment preallocated with zeros (what the WAL does), which flush data only."""
    record = b"x" * 123 + b"\n"
    space = (records + 1) * len(record)
    fds: dict[str, int] = {}
    for name in ("growing fsync", "growing fdatasync", "prealloc fdatasync", "prealloc dsync"):
        fd = os.open(directory / name.replace(" ", "-"), os.O_RDWR | os.O_CREAT, 0o644)
        if name.startswith("prealloc"):
            os.pwrite(fd, bytes(space), 0)
            os.fsync(fd)
        fds[name] = fd
    times: dict[str, list[float]] = {name: [] for name in fds}
    for first in range(0, records, block):
        for name, fd in fds.items():
            for i in range(first, min(first + block, records)):
                start = time.perf_counter()
                if name == "prealloc dsync":
                    os.pwritev(fd, [record], i * len(record), os.RWF_DSYNC)
                else:
                    os.pwrite(fd, record, i * len(record))
                    (os.fsync if name == "growing fsync" else os.fdatasync)(fd)
                times[name].append(time.perf_counter() - start)
    for fd in fds.values():
        os.close(fd)
    return times


# ---------------------------------------------------------------------------- (d) rollout loop


def rollout_loop(directory: Path, steps: int, step_seconds: float) -> tuple[float, float, float]:
    """Mean step seconds (plain, with 4 raw write+fsync, with 4 WAL records).

    Each step sleeps (generating a rollout batch); the three kinds of step take turns, so all
    see the same machine load. The raw kind shows what 4 bare fsyncs after an idle pause cost
    on this disk, which the WAL cannot go below.
    """
    wal = WriteAheadLog(directory / "wal")
    raw_fd = os.open(directory / "raw.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    payload = b"x" * 123 + b"\n"
    times: list[list[float]] = [[], [], []]
    for step in range(3 * steps):
        kind = step % 3
        start = time.perf_counter()
        time.sleep(step_seconds)
        if kind == 1:
            for _ in range(4):
                os.write(raw_fd, payload)
                os.fsync(raw_fd)
        elif kind == 2:
            gen, reward = f"gen-{step}", f"reward-{step}"
            wal.append(gen, "generate")
            wal.update_status(gen, "completed")
            wal.append(reward, "reward")
            wal.update_status(reward, "completed")
        times[kind].append(time.perf_counter() - start)
    wal.close()
    os.close(raw_fd)
    plain, raw, logged = (statistics.fmean(t) for t in times)
    return plain, raw, logged


def several_shapes(root: Path, args: argparse.Namespace, threads: int, per_call: int) -> None:
    """(b) and (c) for one shape of writers, all designs interleaved round by round."""
    shape = f"{args.processes} proc x {threads} thr"
    if per_call > 1:
        shape += f", {per_call} records (one step) per append_many"
    per_thread = max(args.per_writer // threads, 1)
    designs: dict[str, Opener] = {
        "wal": _open_wal,
        "naive": _open_locked_fsync,
        "sqlite": _open_sqlite,
        "nosync": _open_wal_without_fsync,
        "private": _open_private_files,
    }
    totals = {name: Run(0, 0.0, 0, 0.0) for name in designs}
    for r in range(args.rounds):  # interleave the designs so load drift hits all
        for name, opener in designs.items():
            run = several_writers(
                opener,
                root / f"{name}-{threads}-{per_call}-{r}",
                args.processes,
                threads,
                per_thread,
                per_call,
            )
            total = totals[name]
            total.records += run.records
            total.seconds += run.seconds
            total.fsyncs += run.fsyncs
            total.sync_seconds += run.sync_seconds
    wal, naive, sqlite, nosync, private = (
        totals[n].records / totals[n].seconds
        for n in ("wal", "naive", "sqlite", "nosync", "private")
    )
    fsyncs = max(totals["wal"].fsyncs, 1)
    per_sync = totals["wal"].records / fsyncs
    sync_us = totals["wal"].sync_seconds / fsyncs * 1e6
    outstanding = args.processes * threads * per_call
    # Every call waits for its own records, so at most one call's records per thread are
    # waiting when a sync starts: even if every sync covered all of them and nothing else took
    # any time, the WAL could not beat `outstanding` records per (measured, mean) sync.
    sync_bound = outstanding / (sync_us / 1e6)
    # The disk allows the better of sharing syncs (above) and syncing files in parallel
    # (private); the CPUs allow what this WAL does with no sync at all.
    disk_bound = max(sync_bound, private)
    if disk_bound / naive < 5:
        verdict = "out of reach on this disk, whatever the design"
    elif nosync / naive < 5:
        verdict = (
            f"allowed by the disk ({disk_bound / naive:.2f}x) but not by this WAL's CPU cost "
            f"per record ({nosync / naive:.2f}x)"
        )
    else:
        # Both bounds are measured apart; a call still waits for its sync, which the CPU work
        # of the other calls must cover for the WAL to come near its no-fsync pace.
        verdict = (
            f"ruled out neither by the disk ({disk_bound / naive:.2f}x) nor by this WAL's CPU "
            f"cost per record ({nosync / naive:.2f}x) taken apart"
        )
    print(
        f"(b) {shape}: WAL {wal:,.0f} rec/s ({per_sync:.1f} records per sync of mean "
        f"{sync_us:.0f} us), lock+write+fsync {naive:,.0f} rec/s -> {wal / naive:.2f}x "
        f"(target >= 5x: {'met' if wal / naive >= 5 else 'not met'})"
    )
    print(
        f"    ceilings: no fsync at all {nosync:,.0f} rec/s = {nosync / naive:.2f}x naive; "
        f"{outstanding} records (one call per thread) in every sync {sync_bound:,.0f} rec/s = "
        f"{sync_bound / naive:.2f}x naive; every thread syncing a file of its own (parallel "
        f"syncs, no log) {private:,.0f} rec/s = {private / naive:.2f}x naive -> this shape: "
        f"5x is {verdict}"
    )
    print(
        f"(c) {shape}: WAL {wal:,.0f} rec/s, SQLite WAL synchronous=FULL {sqlite:,.0f} "
        f"rows/s -> {wal / sqlite:.2f}x (target >= 5x: {'met' if wal / sqlite >= 5 else 'not met'})"
    )


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--records", type=int, default=2000, help="(a) records per design")
    parser.add_argument("--block", type=int, default=25, help="(a) records per alternation")
    parser.add_argument("--rounds", type=int, default=4, help="(b)/(c) interleaved rounds")
    parser.add_argument("--processes", type=int, default=4, help="(b)/(c) writer processes")
    parser.add_argument(
        "--threads", type=int, default=4, help="(b)/(c) appender threads per process"
    )
    parser.add_argument(
        "--step-records",
        type=int,
        default=4,
        help="(b)/(c) records one rollout step logs with one append_many call",
    )
    parser.add_argument(
        "--per-writer",
        type=int,
        default=160,
        help="(b)/(c) records per writer process and round (split among its threads)",
    )
    parser.add_argument("--steps", type=int, default=40, help="(d) steps of each kind")
    parser.add_argument("--step-ms", type=float, default=50.0, help="(d) sleep per step")
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to write (default: a temp dir)"
    )
    args = parser.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="walbench-", dir=args.dir))
    try:
        print(f"write-ahead log benchmark in {root} (python {sys.version.split()[0]})")

        (root / "disk").mkdir()
        costs = sync_costs(root / "disk", args.records // 4, args.block)
        print(
            "disk: write+sync of one record, interleaved (p50 / mean us): "
            + "; ".join(
                f"{name} {statistics.median(t) * 1e6:.0f} / {statistics.fmean(t) * 1e6:.0f}"
                for name, t in costs.items()
            )
        )

        wal_rate, raw_rate, record_bytes, wal_sync = one_writer(root, args.records, args.block)
        ratio_a = wal_rate / raw_rate
        print(
            f"(a) one writer, {args.records} records of {record_bytes} B: "
            f"WAL {wal_rate:,.0f} rec/s, raw write+fsync {raw_rate:,.0f} rec/s -> "
            f"{ratio_a:.2f}x (target >= 0.85x)"
        )
        print(
            f"    per record: WAL {1e6 / wal_rate:.0f} us, of which its sync (RWF_DSYNC write or "
            f"fdatasync, preallocated segment) {wal_sync * 1e6:.0f} us; raw write+fsync of a "
            f"growing file {1e6 / raw_rate:.0f} us"
        )

        for threads, per_call in dict.fromkeys([(1, 1), (args.threads, 1), (1, args.step_records)]):
            several_shapes(root, args, threads, per_call)

        (root / "d").mkdir()
        base, raw_step, with_wal = rollout_loop(root / "d", args.steps, args.step_ms / 1000.0)
        overhead = (with_wal - base) / base * 100.0
        print(
            f"(d) rollout loop, {args.steps} steps of each kind, {args.step_ms:g} ms sleep, "
            f"4 records per step: {base * 1000:.2f} ms per step without WAL, "
            f"{with_wal * 1000:.2f} ms with -> overhead {overhead:.2f} % "
            f"(target < 5 %; the seeds quote 5-15 %)"
        )
        print(
            f"    same loop with 4 bare write+fsync instead of the WAL: {raw_step * 1000:.2f} ms "
            f"per step = {(raw_step - base) / base * 100:.2f} % (the floor this disk allows); "
            f"WAL / bare fsync cost: {(with_wal - base) / max(raw_step - base, 1e-9):.2f}x"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
