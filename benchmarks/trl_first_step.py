"""What a fresh process's first GRPO step costs against the median step, with and without the
warm standby's warm-up (:func:`integrations.trl.warmup.warm_up`) run before the trainer exists.

Each run is a fresh Python process (``--child``) that imports examples/trl_grpo/train.py, runs
the warm-up or not, builds the trainer (``--rlguard off``) and trains ``--steps`` steps, timing
every step from the Trainer's step-begin to its step-end callback: wall time, the process's
CPU time (user + system, all threads; on a shared machine it moves less with the load than the
wall time does) and the wall time of the step's ``generate`` (the part the warm-up pre-pays). Runs alternate cold / warm; prints per run the first step, the
median of the others and first / median, then the medians over runs, and the load average at
each run's start (figures at load > 1.5 on this 2-core host are loaded-machine figures).

    .venv/bin/python benchmarks/trl_first_step.py --runs 3 --size tiny --steps 8
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def child(size: str, steps: int, warm: bool, out: str) -> dict[str, Any]:
    """One fresh process's run: the per-step wall and CPU seconds."""
    sys.path[:0] = [str(ROOT), str(ROOT / "examples" / "trl_grpo")]
    import train
    from transformers import TrainerCallback

    warm_s = None
    if warm:
        from integrations.trl.warmup import warm_up

        start = time.perf_counter()
        warm_up()
        warm_s = time.perf_counter() - start
    args = train.parse_args(
        [
            "--output_dir",
            out,
            "--max_steps",
            str(steps),
            "--size",
            size,
            "--rlguard",
            "off",
            "--save_steps",
            str(steps + 1),
        ]
    )
    train.torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))  # as train.main does
    trainer = train.build_trainer(args)
    walls: list[float] = []
    cpus: list[float] = []
    gens: list[float] = []  # the step's generate calls (GRPO generates once per step here)
    generate = trainer.model.generate

    def timed_generate(*a: Any, **k: Any) -> Any:
        start = time.perf_counter()
        try:
            return generate(*a, **k)
        finally:
            gens.append(time.perf_counter() - start)

    trainer.model.generate = timed_generate

    class Timer(TrainerCallback):
        def on_step_begin(self, *_a: Any, **_k: Any) -> None:
            self.wall, self.cpu = time.perf_counter(), _cpu()

        def on_step_end(self, *_a: Any, **_k: Any) -> None:
            walls.append(time.perf_counter() - self.wall)
            cpus.append(_cpu() - self.cpu)

    trainer.add_callback(Timer())
    trainer.train()
    return {"warm": warm, "warm_up_s": warm_s, "wall": walls, "cpu": cpus, "generate": gens}


def _ratio(values: list[float]) -> tuple[float, float, float]:
    median = statistics.median(values[1:])
    return values[0], median, values[0] / median


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="runs of each way (cold, warm)")
    p.add_argument("--size", default="tiny", help="the example's --size")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--child", choices=("cold", "warm"), help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.steps < 3:
        p.error(f"--steps must be >= 3, got {args.steps}")
    if args.runs < 1:
        p.error(f"--runs must be >= 1, got {args.runs}")
    if args.child:
        result = child(args.size, args.steps, args.child == "warm", args.out)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    kinds = ("wall", "cpu", "generate")
    ratios: dict[str, dict[str, list[float]]] = {
        w: {k: [] for k in kinds} for w in ("cold", "warm")
    }
    with tempfile.TemporaryDirectory(prefix="rlguard-first-step-") as tmp:
        for i in range(args.runs * 2):
            way = ("cold", "warm")[i % 2]
            load = os.getloadavg()[0]
            proc = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    way,
                    "--size",
                    args.size,
                    "--steps",
                    str(args.steps),
                    "--out",
                    str(Path(tmp) / f"run{i}"),
                ],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=1800,
                check=True,
            )
            line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
            res = json.loads(line[len("RESULT ") :])
            text = [f"{way} run {i // 2 + 1} (load {load:.2f})"]
            if res["warm_up_s"] is not None:
                text.append(f"warm-up {res['warm_up_s']:.2f} s")
            for kind in kinds:
                first, median, ratio = _ratio(res[kind])
                ratios[way][kind].append(ratio)
                text.append(f"{kind}: first {first:.3f} s, median {median:.3f} s, x{ratio:.2f}")
            print("; ".join(text), flush=True)
    for way in ("cold", "warm"):
        print(
            f"{way}: first / median, median of {args.runs} runs: "
            + ", ".join(f"{k} x{statistics.median(ratios[way][k]):.2f}" for k in kinds)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
