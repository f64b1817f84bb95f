"""``benchmarks/ettr_trl.py``'s per-fault accounting: when the first step after a fault finished,
and how many steps trained before it were trained again (the resumed checkpoint's age)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[4]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ettr_trl", ROOT / "benchmarks" / "ettr_trl.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("ettr_trl", module)
    spec.loader.exec_module(module)
    return module


def _steps(out: Path, rows: list[tuple[int, int, float]]) -> None:
    lines = [json.dumps({"step": step, "pid": pid, "t": t}) for step, pid, t in rows]
    (out / "steps.jsonl").write_text("\n".join(lines) + "\n")


def test_a_fault_before_a_save_redoes_the_steps_since_the_previous_checkpoint(
    tmp_path: Path,
) -> None:
    bench = _bench()
    # Steps 1-10 by pid 1; the kill at t=10.5 tore checkpoint-10: pid 2 resumed from
    # checkpoint-5 and trained 6-10 again.
    _steps(
        tmp_path,
        [(s, 1, float(s)) for s in range(1, 11)] + [(s, 2, 12.0 + s) for s in range(6, 12)],
    )
    fault = bench.Fault("kill", 10, 10.5, 1)
    assert bench.first_step_after(tmp_path, fault) == 18.0
    assert fault.redone == 5


def test_a_fault_right_after_a_sealed_checkpoint_redoes_nothing(tmp_path: Path) -> None:
    bench = _bench()
    _steps(tmp_path, [(s, 1, float(s)) for s in range(1, 11)] + [(11, 2, 14.0)])
    fault = bench.Fault("hang", 10, 10.5, 1)
    assert bench.first_step_after(tmp_path, fault) == 14.0
    assert fault.redone == 0


def test_no_step_after_the_fault_yet(tmp_path: Path) -> None:
    bench = _bench()
    _steps(tmp_path, [(s, 1, float(s)) for s in range(1, 4)])
    fault = bench.Fault("kill", 3, 3.5, 1)
    assert bench.first_step_after(tmp_path, fault) is None
    assert fault.redone is None
