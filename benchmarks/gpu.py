"""GPU figures of the recovery library, each against a baseline measured in the same run: the
checkpoint engine with the trainer's state on the GPU, and weight transfer GPU to GPU.

    python benchmarks/gpu.py                 # ~2 GiB of state, 1 GiB of weights (the defaults)
    python benchmarks/gpu.py --size-mb 256   # quick

Needs an NVIDIA GPU (it stops at once without one). Run by ``scripts/gpu-check.sh``.

1. Save blocking time (the trainer's pause) of ``CheckpointEngine.save`` on CUDA tensors, with
   pinned host buffers (``pin_memory=True``: device-to-host copies queued asynchronously, one
   synchronisation) and with pageable buffers, against ``torch.save`` + fsync of the same state.
   Also against the bare device-to-host copy into pinned memory (the floor the engine can reach).
2. Restore to the GPU: ``latest()`` + ``load(map_location="cuda")`` (every byte's checksum
   verified) against ``torch.load(map_location="cuda")`` of a ``torch.save`` file of the same
   state (no checks), both from a page cache our files were dropped from.
3. Weight transfer GPU to GPU per transport (tcp, ucx where ucxx is installed): ``publish`` of
   CUDA weights (staged to pinned memory) + ``pull`` + copy of the live tensors to the GPU,
   against the bare device-to-host and host-to-device copies of the same bytes.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from checkpoint import evict, files_under, make_state, state_bytes, torch_save_fsync  # noqa: E402

from recovery.checkpoint.engine import CheckpointEngine  # noqa: E402
from recovery.checkpoint.version import VersionVector  # noqa: E402
from recovery.transfer import (  # noqa: E402
    InMemoryRegistry,
    TensorSpec,
    TransportUnavailableError,
    WeightPublisher,
    WeightReceiver,
    make_transport,
)

GIB = 1 << 30


def to_cuda(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.cuda()
    if isinstance(value, dict):
        return {k: to_cuda(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_cuda(v) for v in value]
    return value


def best_of(repeat: int, fn: Callable[[], float]) -> tuple[float, float]:
    """(min, median) seconds of ``repeat`` calls of ``fn`` (which returns its own seconds)."""
    times = [fn() for _ in range(repeat)]
    return min(times), statistics.median(times)


def checkpoint_figures(size_mb: int, repeat: int, scratch: Path) -> None:
    state = to_cuda(make_state(size_mb))
    tensors = [t for t in state["model"].values()]
    tensors += [t for s in state["optimizer"]["state"].values() for t in s.values()]
    nbytes = state_bytes(state)
    print(f"checkpoint: state {nbytes / GIB:.2f} GiB on {torch.cuda.get_device_name(0)}")

    pinned_dst = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]

    def bare_copy() -> float:
        t0 = time.perf_counter()
        for dst, src in zip(pinned_dst, tensors, strict=True):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    bare_copy()
    floor = best_of(repeat, bare_copy)

    torch_path = scratch / "torch.pt"
    torch_save_fsync(state, torch_path)
    baseline = best_of(repeat, lambda: torch_save_fsync(state, torch_path))
    print(f"  torch.save + fsync            min {baseline[0]:.3f} s  median {baseline[1]:.3f} s")
    print(
        f"  bare D2H copy, pinned         min {floor[0]:.3f} s  median {floor[1]:.3f} s"
        f"  ({nbytes / floor[0] / 1e9:.1f} GB/s)"
    )
    engines = {}
    for label, pinned in (("pinned", True), ("pageable", False)):
        engine = CheckpointEngine(scratch / label, pin_memory=pinned, keep=2)
        engines[label] = engine
        step = [0]

        def save(engine: CheckpointEngine = engine, step: list[int] = step) -> float:
            step[0] += 1
            t0 = time.perf_counter()
            handle = engine.save(state, version=VersionVector(step[0], 1))
            blocking = time.perf_counter() - t0
            handle.wait_finished(3600)
            return blocking

        save()  # the first save allocates (and faults in) the host buffers
        blocking = best_of(repeat, save)
        print(
            f"  engine.save blocking, {label:8s} min {blocking[0]:.3f} s  median {blocking[1]:.3f} s"
            f"  -> {baseline[1] / blocking[1]:.1f}x shorter than torch.save (median),"
            f" {floor[1] / blocking[1]:.2f}x of the bare copy's speed"
        )

    reference = tensors[0]

    def torch_load() -> float:
        evict([torch_path])
        t0 = time.perf_counter()
        loaded = torch.load(torch_path, map_location="cuda", weights_only=True)
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        assert torch.equal(loaded["model"]["layer0.weight"], reference)
        return elapsed

    def engine_load(engine: CheckpointEngine = engines["pinned"]) -> float:
        evict(files_under(engine.root))
        t0 = time.perf_counter()
        info = engine.latest()
        assert info is not None
        loaded = engine.load(info, map_location="cuda")
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        assert torch.equal(loaded["model"]["layer0.weight"], reference)
        return elapsed

    ratios, bases, ours_all = [], [], []
    for _ in range(repeat):
        base, ours = torch_load(), engine_load()
        ratios.append(base / ours)
        bases.append(base)
        ours_all.append(ours)
    print(
        f"  restore to GPU: torch.load median {statistics.median(bases):.3f} s, latest()+load()"
        f" median {statistics.median(ours_all):.3f} s; ratio min {min(ratios):.2f}x"
        f"  median {statistics.median(ratios):.2f}x  max {max(ratios):.2f}x  (target >= 1.0x)"
    )


def transfer_figures(size_mb: int, repeat: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    per = 16 << 20
    weights = {
        f"w{i}": torch.randn(per // 2, device="cuda", generator=g).to(torch.bfloat16)
        for i in range(max(1, size_mb // 16))
    }
    nbytes = sum(t.numel() * t.element_size() for t in weights.values())
    host = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for k, v in weights.items()}
    back = {k: torch.empty_like(v) for k, v in weights.items()}

    def bare_copies() -> float:
        t0 = time.perf_counter()
        for k, v in weights.items():
            host[k].copy_(v, non_blocking=True)
        torch.cuda.synchronize()
        for k, v in host.items():
            back[k].copy_(v, non_blocking=True)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    bare_copies()
    floor = best_of(repeat, bare_copies)
    print(
        f"transfer: {nbytes / GIB:.2f} GiB of bf16 weights GPU -> GPU; bare D2H + H2D copies"
        f" median {floor[1]:.3f} s"
    )
    specs = [TensorSpec.of(k, v.cpu()) for k, v in weights.items()]
    for kind in ("tcp", "ucx"):
        try:
            transport = make_transport(kind)
        except TransportUnavailableError as exc:
            print(f"  {kind}: not measured ({exc})")
            continue
        registry = InMemoryRegistry()
        publisher = WeightPublisher("bench", transport=transport, registry=registry)
        receiver = WeightReceiver(
            "bench", specs, transport=transport, registry=registry, timeout=60
        )
        version = [0]
        stages: dict[str, list[float]] = {"publish": [], "pull": [], "to GPU": []}

        def one(
            publisher: WeightPublisher = publisher,
            receiver: WeightReceiver = receiver,
            version: list[int] = version,
            stages: dict[str, list[float]] = stages,
        ) -> float:
            version[0] += 1
            t0 = time.perf_counter()
            publication = publisher.publish(version[0], weights)
            t1 = time.perf_counter()
            receiver.pull(version[0], timeout=600)
            t2 = time.perf_counter()
            for k, v in receiver.live_tensors.items():
                back[k].copy_(v, non_blocking=False)
            torch.cuda.synchronize()
            elapsed = time.perf_counter() - t0
            for stage, seconds in zip(stages, (t1 - t0, t2 - t1, elapsed - (t2 - t0)), strict=True):
                stages[stage].append(seconds)
            publication.wait_committed(timeout=60)
            if version[0] > 2:
                publisher.retire(version[0] - 2)
            return elapsed

        try:
            # Three warm-up rounds: until a retired version's pinned staging buffers come back
            # (two versions stay served), each publish allocates pinned memory afresh.
            for _ in range(3):
                one()
            for seconds in stages.values():
                seconds.clear()
            ours = best_of(repeat, one)
            assert all(torch.equal(back[k], v) for k, v in weights.items())
        finally:
            receiver.close()
            publisher.close()
        print(
            f"  {kind}: publish + pull + H2D min {ours[0]:.3f} s  median {ours[1]:.3f} s"
            f"  ({nbytes / ours[1] / 1e9:.2f} GB/s; bare copies / ours {floor[1] / ours[1]:.2f}x)"
        )
        print(
            f"  {kind}: medians per stage: "
            + ", ".join(
                f"{stage} {statistics.median(seconds):.3f} s" for stage, seconds in stages.items()
            )
            + " (publish = stage to pinned memory + checksum every chunk)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mb", type=int, default=2048, help="checkpoint state (default 2048)")
    parser.add_argument("--transfer-mb", type=int, default=1024, help="weight set (default 1024)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory")
    args = parser.parse_args()
    for name in ("size_mb", "transfer_mb", "repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not torch.cuda.is_available():
        sys.exit("benchmarks/gpu.py needs an NVIDIA GPU: torch.cuda.is_available() is False")
    scratch = Path(tempfile.mkdtemp(prefix="rlguard-gpu-bench-", dir=args.dir))
    try:
        checkpoint_figures(args.size_mb, args.repeat, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    transfer_figures(args.transfer_mb, args.repeat)


if __name__ == "__main__":
    main()
