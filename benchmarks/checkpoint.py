"""Checkpoint engine benchmark: blocking time, persist throughput and restore time, each against
a baseline measured in the same run on the same bytes.

    .venv/bin/python benchmarks/checkpoint.py                 # ~500 MB state (the default)
    .venv/bin/python benchmarks/checkpoint.py --size-mb 16    # quick smoke run

    .venv/bin/python benchmarks/checkpoint.py --restore-only --repeat 5   # restore figures only

Figures (targets from issues 4 and 24):
  1. blocking time of ``CheckpointEngine.save`` vs ``torch.save`` + fsync      target >= 5x shorter
  2. end-to-end persist throughput (save → COMMITTED) vs raw write + fsync      target >= 0.7x
  3. restore: ``torch.load`` time / (``latest()`` + ``load()`` time), per checksum algorithm,
     min/median/max over the runs of the per-run ratio                          target >= 1.0x

The engine runs with its defaults (O_DIRECT writes from block-aligned host buffers) and with
each checksum (CRC-32C, the default; SHA-256; CRC-32); the raw baseline is a plain buffered
write. Each engine's first save allocates its host buffers (cold: fresh pages fault in during
the copy); later saves reuse them (warm). Freed memory on these machines goes back to the host
after about 2 s idle, so the output says which figure was measured with warm buffers.

What the restore figure measures: in every run, ``torch.load`` of a ``torch.save`` file of the
same state (the baseline, no integrity check) and then, per algorithm, ``latest()`` + ``load()``
of that engine's newest checkpoint (every byte read once and its checksum verified, bit-exact
result asserted). Before each of these reads our own files are written back and dropped from the
page cache (fsync + posix_fadvise DONTNEED, nothing else is touched), so both start equally
"cold-ish": on a virtual disk the host may still cache the blocks, which makes the reads faster
than a real cold read but equally so for both. ``load_latest()`` (the restore path with fallback:
marker-only choice, then one verifying load) is timed the same way.

The restore rounds run twice. In-process: every round in the benchmark's own process; there
``torch.load``'s per-tensor 16 MiB allocations are served from heap the previous round freed
(already faulted in), while the engine's one buffer per layer file is a fresh mapping whose
pages fault in during the read (on these VMs that is a large part of a read's cost). Fresh
process: each restore in a new Python process (imports before the clock starts), the situation
of a restart after a crash, where neither side has memory left over.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from recovery.checkpoint.engine import CheckpointEngine
from recovery.checkpoint.version import VersionVector

TENSOR_MB = 16


def make_state(size_mb: int) -> dict[str, Any]:
    """A training-shaped state: parameters (1/3 of the bytes) and two Adam moments (2/3)."""
    per_tensor = TENSOR_MB * (1 << 20) // 4
    n = max(3, round(size_mb / TENSOR_MB))
    n_params = max(1, n // 3)
    g = torch.Generator().manual_seed(0)
    params = {f"layer{i}.weight": torch.randn(per_tensor, generator=g) for i in range(n_params)}
    opt_state = {
        i: {
            "step": torch.tensor(100.0),
            "exp_avg": torch.randn(per_tensor, generator=g),
            "exp_avg_sq": torch.rand(per_tensor, generator=g),
        }
        for i in range(n_params)
    }
    return {
        "model": params,
        "optimizer": {
            "state": opt_state,
            "param_groups": [{"lr": 1e-5, "betas": (0.9, 0.999), "params": list(range(n_params))}],
        },
        "lr_scheduler": {"last_epoch": 100, "base_lrs": [1e-5]},
        "step": 100,
        "inference_weight_version": 33,
        "generation_config": {"temperature": 1.0, "top_p": 1.0},
    }


def state_bytes(state: dict[str, Any]) -> int:
    total = sum(t.numel() * t.element_size() for t in state["model"].values())
    for s in state["optimizer"]["state"].values():
        total += sum(t.numel() * t.element_size() for t in s.values())
    return total


def evict(paths: list[Path]) -> None:
    """Drop our own files from the page cache so the next read comes from disk."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def files_under(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]


def torch_save_fsync(state: dict[str, Any], path: Path) -> float:
    t0 = time.perf_counter()
    with open(path, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    return time.perf_counter() - t0


def raw_write_fsync(data: memoryview, path: Path) -> float:
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        pos = 0
        while pos < len(data):
            pos += os.write(fd, data[pos : pos + (8 << 20)])
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mb", type=int, default=500, help="state size (default 500)")
    parser.add_argument("--repeat", type=int, default=5, help="measured rounds (default 5)")
    parser.add_argument(
        "--restore-only",
        action="store_true",
        help="one save per engine, then only the restore measurements",
    )
    parser.add_argument(
        "--dir", type=Path, default=None, help="scratch directory (default: a temp dir)"
    )
    parser.add_argument(
        "--no-fresh-process",
        action="store_true",
        help="skip the restore rounds timed in fresh processes",
    )
    # Internal: one restore timed inside a fresh process (see fresh_process_seconds).
    parser.add_argument("--time-one", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.time_one:
        print(time_one(args.time_one[0], Path(args.time_one[1])))
        return
    if args.size_mb < 1:
        parser.error(f"--size-mb must be >= 1, got {args.size_mb}")
    if args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    scratch = Path(tempfile.mkdtemp(prefix="rlguard-ckpt-bench-", dir=args.dir))
    try:
        run(args.size_mb, scratch, args.repeat, args.restore_only, not args.no_fresh_process)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def timed_save(engine: CheckpointEngine, state: dict[str, Any], step: int) -> tuple[float, float]:
    """(blocking seconds, seconds until COMMITTED) of one save; waits for its background job."""
    t0 = time.perf_counter()
    handle = engine.save(state, version=VersionVector(step, 33))
    blocking = time.perf_counter() - t0
    handle.wait(3600)
    e2e = time.perf_counter() - t0
    handle.wait_finished(3600)
    return blocking, e2e


def timed_restore(engine: CheckpointEngine, reference: torch.Tensor) -> tuple[float, float]:
    """(latest() seconds, latest()+load() seconds) from a cold-ish page cache."""
    evict(files_under(engine.root))
    t0 = time.perf_counter()
    info = engine.latest()
    t_latest = time.perf_counter() - t0
    assert info is not None
    loaded = engine.load(info)
    t_total = time.perf_counter() - t0
    assert torch.equal(loaded["model"]["layer0.weight"], reference)
    return t_latest, t_total


def timed_load_latest(engine: CheckpointEngine, reference: torch.Tensor) -> float:
    """Seconds of load_latest() (marker-only choice, one verifying read) from a cold-ish cache."""
    evict(files_under(engine.root))
    t0 = time.perf_counter()
    found = engine.load_latest()
    elapsed = time.perf_counter() - t0
    assert found is not None
    assert torch.equal(found[1]["model"]["layer0.weight"], reference)
    return elapsed


def timed_torch_load(path: Path) -> float:
    evict(files_under(path))
    t0 = time.perf_counter()
    loaded = torch.load(path, weights_only=True)
    elapsed = time.perf_counter() - t0
    del loaded
    return elapsed


CHECKSUMS = ("crc32c", "sha256", "crc32")


def time_one(kind: str, path: Path) -> float:
    """Seconds of one cold-ish restore in this (fresh) process: ``torch`` (torch.load of
    ``path``) or ``engine`` (latest() + load() of the root ``path``)."""
    if kind == "torch":
        return timed_torch_load(path)
    if kind == "engine":
        engine = CheckpointEngine(path)
        evict(files_under(path))
        t0 = time.perf_counter()
        info = engine.latest()
        assert info is not None
        loaded = engine.load(info)
        elapsed = time.perf_counter() - t0
        assert loaded["model"]["layer0.weight"].numel() == TENSOR_MB * (1 << 20) // 4
        return elapsed
    raise SystemExit(f"--time-one: unknown kind {kind!r}")


def fresh_process_seconds(kind: str, path: Path) -> float:
    """Run one restore in a new Python process (imports done before the clock starts): what a
    restart after a crash does, with no heap left over from an earlier load for either side."""
    out = subprocess.run(
        [sys.executable, __file__, "--time-one", kind, str(path)],
        check=True,
        capture_output=True,
        text=True,
        # The repo first, then whatever the caller's PYTHONPATH already held (where the
        # dependencies may live, as on a machine without the project's virtualenv).
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                p
                for p in (str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH"))
                if p
            ),
        },
    )
    return float(out.stdout.strip().splitlines()[-1])


def run(size_mb: int, scratch: Path, repeat: int, restore_only: bool, fresh: bool) -> None:
    state = make_state(size_mb)
    mb = state_bytes(state) / (1 << 20)
    load_before = os.getloadavg()[0]
    print(
        f"state: {mb:.0f} MiB in {len(state['model']) * 3} tensors; {repeat} rounds; "
        f"torch threads {torch.get_num_threads()}; {scratch}"
    )

    # The first save of each engine allocates its host buffers (cold); later saves reuse them
    # (warm). Each round then runs the baselines and every engine back to back, so the noise of
    # the shared disk and CPUs hits all of them alike; medians are reported.
    engines = {
        c: CheckpointEngine(scratch / f"engine-{c}", keep=1, checksum=c)  # type: ignore[arg-type]
        for c in CHECKSUMS
    }
    cold = {c: timed_save(e, state, 0) for c, e in engines.items()}
    with open(scratch / "baseline.pt", "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    rows: list[tuple[str, float, float]] = []
    verdicts: list[str] = []
    if not restore_only:
        verdicts = save_rows(engines, state, mb, cold, scratch, repeat, rows)

    reference = state["model"]["layer0.weight"]
    t_torch_load: list[float] = []
    t_latest: dict[str, list[float]] = {c: [] for c in engines}
    t_restore: dict[str, list[float]] = {c: [] for c in engines}
    t_load_latest: dict[str, list[float]] = {c: [] for c in engines}
    for _ in range(repeat):
        t_torch_load.append(timed_torch_load(scratch / "baseline.pt"))
        for c, engine in engines.items():
            a, b = timed_restore(engine, reference)
            t_latest[c].append(a)
            t_restore[c].append(b)
            t_load_latest[c].append(timed_load_latest(engine, reference))
    for engine in engines.values():
        engine.close()
    fresh_torch: list[float] = []
    fresh_engine: dict[str, list[float]] = {c: [] for c in engines}
    for _ in range(repeat if fresh else 0):
        fresh_torch.append(fresh_process_seconds("torch", scratch / "baseline.pt"))
        for c, engine in engines.items():
            fresh_engine[c].append(fresh_process_seconds("engine", engine.root))

    med = statistics.median
    rows.append(("torch.load, cold-ish page cache (baseline)", med(t_torch_load), mb))
    for c in engines:
        rows.append((f"[{c}] latest() (reads + verifies, keeps bytes)", med(t_latest[c]), mb))
        rows.append((f"[{c}] latest() + load()", med(t_restore[c]), mb))
        rows.append((f"[{c}] load_latest()", med(t_load_latest[c]), mb))

    print()
    if not restore_only:
        print("host buffers: 'cold' = an engine's first save, which allocates them (pages fault")
        print("in during the copy); 'warm' = later saves reusing them (resident: each follows")
        print("the previous by < 2 s of idle, so nothing was handed back), or the first save")
        print("after preallocate() faulted them in at startup. State tensors: warm throughout.")
    print(
        f"load average 1 min: {load_before:.1f} before, {os.getloadavg()[0]:.1f} after "
        f"({os.cpu_count()} CPUs shared with other work)"
    )
    print()
    header = f"measurement (median of {repeat} unless noted)"
    print(f"{header:<52} {'seconds':>9} {'MiB/s':>9}")
    for label, seconds, size in rows:
        print(f"{label:<52} {seconds:9.3f} {size / seconds:9.0f}")
    print()
    for line in verdicts:
        print(line)
    print(f"restore ratio per run = torch.load seconds / engine seconds, same run ({repeat} runs);")
    print("in-process: every round in this process (torch.load's 16 MiB tensors come back from")
    print("the heap the previous round freed; a layer buffer is one fresh mapping, faulted in)")
    for c in engines:
        for label, times in (
            ("latest() + load()", t_restore[c]),
            ("load_latest()", t_load_latest[c]),
        ):
            print(ratio_line(c, label, t_torch_load, times))
    print(
        f"per-round seconds: torch.load {fmt(t_torch_load)}; "
        + "; ".join(f"{c} latest+load {fmt(t_restore[c])}" for c in engines)
    )
    if fresh:
        print("fresh process: each restore in a new process, as after a crash (imports untimed)")
        for c in engines:
            print(ratio_line(c, "latest() + load()", fresh_torch, fresh_engine[c]))
        print(
            f"per-round seconds: torch.load {fmt(fresh_torch)}; "
            + "; ".join(f"{c} latest+load {fmt(fresh_engine[c])}" for c in engines)
        )


def ratio_line(c: str, label: str, baseline: list[float], times: list[float]) -> str:
    ratios = [t / e for t, e in zip(baseline, times, strict=True)]
    med = statistics.median(ratios)
    return (
        f"[{c}] torch.load / ({label}){'':<{18 - len(label)}} min {min(ratios):5.2f}x "
        f"median {med:5.2f}x max {max(ratios):5.2f}x (>= 1.0x: {verdict(med >= 1.0)})"
    )


def verdict(ok: bool) -> str:
    return "meets target" if ok else "MISSES target"


def save_rows(
    engines: dict[str, CheckpointEngine],
    state: dict[str, Any],
    mb: float,
    cold: dict[str, tuple[float, float]],
    scratch: Path,
    repeat: int,
    rows: list[tuple[str, float, float]],
) -> list[str]:
    """The save figures (1 and 2): rows appended to ``rows``; returns the verdict lines."""
    # What preallocate() at startup buys: the first save of a fresh engine, buffers faulted in.
    spare = CheckpointEngine(scratch / "engine-prealloc", keep=1)
    t0 = time.perf_counter()
    spare.preallocate(state)
    t_prealloc = time.perf_counter() - t0
    prealloc_blocking, _ = timed_save(spare, state, 0)
    spare.close()
    shutil.rmtree(spare.root)
    first = next(iter(engines.values()))
    info = first.latest(valid_only=False)
    assert info is not None
    used = int(info.files["core.bin"]["size"])
    raw_bytes = memoryview(first._buffers["core"][:used].numpy().data)

    t_torch_save: list[float] = []
    t_raw: list[float] = []
    blocking: dict[str, list[float]] = {c: [] for c in engines}
    e2e: dict[str, list[float]] = {c: [] for c in engines}
    for i in range(repeat):
        t_torch_save.append(torch_save_fsync(state, scratch / "save-baseline.pt"))
        t_raw.append(raw_write_fsync(raw_bytes, scratch / "raw.bin"))
        (scratch / "raw.bin").unlink()
        for c, engine in engines.items():
            b, e = timed_save(engine, state, 1 + i)
            blocking[c].append(b)
            e2e[c].append(e)
    del raw_bytes
    (scratch / "save-baseline.pt").unlink()

    med = statistics.median
    raw_mb = used / (1 << 20)
    rows.append(("torch.save + fsync (baseline, blocking)", med(t_torch_save), mb))
    for c in engines:
        rows.append((f"[{c}] engine.save blocking, cold buffers (1 run)", cold[c][0], mb))
        rows.append((f"[{c}] engine.save blocking, warm buffers", med(blocking[c]), mb))
    rows.append(("[crc32c] preallocate() at startup (1 run)", t_prealloc, mb))
    rows.append(("[crc32c] first save blocking after preallocate()", prealloc_blocking, mb))
    rows.append(("raw write + fsync of the same bytes (baseline)", med(t_raw), raw_mb))
    for c in engines:
        rows.append((f"[{c}] save -> COMMITTED, cold buffers (1 run)", cold[c][1], mb))
        rows.append((f"[{c}] save -> COMMITTED, warm buffers", med(e2e[c]), mb))
    lines = []
    for c in engines:
        r_block = med(t_torch_save) / med(blocking[c])
        r_cold = med(t_torch_save) / cold[c][0]
        r_tput = (mb / med(e2e[c])) / (raw_mb / med(t_raw))
        lines.append(
            f"[{c}] blocking: torch.save+fsync / save (warm) = {r_block:6.1f}x "
            f"(>= 5x: {verdict(r_block >= 5)}); cold buffers {r_cold:.1f}x"
        )
        lines.append(
            f"[{c}] persist throughput / raw write+fsync      = {r_tput:6.2f}x "
            f"(>= 0.7x: {verdict(r_tput >= 0.7)})"
        )
    lines.append(
        f"per-round seconds: torch.save {fmt(t_torch_save)}; raw {fmt(t_raw)}; "
        + "; ".join(f"{c} e2e {fmt(e2e[c])}" for c in engines)
    )
    return lines


def fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "]"


if __name__ == "__main__":
    main()
