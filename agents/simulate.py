"""Fault injection into the simulated NVML of a running agent, through files in the run directory.

Drop a JSON file into ``<run_dir>/rlguard-simulate/`` (write it under another name and rename it
there, or write it whole: the agent only reads ``*.json``). The agent applies it on its next
round and renames it to ``*.applied``; a file it cannot use becomes ``*.rejected`` and the reason
is logged. Faults:

- ``{"fault": "xid", "gpu": 0, "xid": 79}``: an XID event (79 also makes the GPU fall off the bus)
- ``{"fault": "ecc_uncorrectable", "gpu": 1, "count": 1}``: uncorrectable ECC errors (+ XID 48)
- ``{"fault": "thermal", "gpu": 2, "on": true}``: thermal throttling on (or off with false)
- ``{"fault": "gpu_lost", "gpu": 3}`` / ``{"fault": "gpu_restore", "gpu": 3}``
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import orjson

from agents.fake_nvml import FakeNVML

log = logging.getLogger("rlguard.agent.simulate")

FAULT_DIRNAME = "rlguard-simulate"
FAULT_KINDS = ("xid", "ecc_uncorrectable", "thermal", "gpu_lost", "gpu_restore")


class FaultSpecError(ValueError):
    """A fault file that cannot be applied; the message names the bad field and value."""


def _int_field(
    doc: dict[str, Any], key: str, *, low: int, high: int, default: int | None = None
) -> int:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise FaultSpecError(f"{key!r} must be an integer in [{low}, {high}], got {value!r}")
    return value


def apply_fault(fake: FakeNVML, doc: object) -> str:
    """Apply one fault description to ``fake``; returns a one-line description of what was done."""
    if not isinstance(doc, dict):
        raise FaultSpecError(f"a fault must be a JSON object, got {doc!r}")
    kind = doc.get("fault")
    if kind not in FAULT_KINDS:
        raise FaultSpecError(f"'fault' must be one of {', '.join(FAULT_KINDS)}, got {kind!r}")
    if not fake.gpus:
        raise FaultSpecError("there are no simulated GPUs")
    gpu = _int_field(doc, "gpu", low=0, high=len(fake.gpus) - 1)
    if kind == "xid":
        xid = _int_field(doc, "xid", low=1, high=1023)
        fake.inject_xid(gpu, xid)
        return f"XID {xid} on gpu {gpu}"
    if kind == "ecc_uncorrectable":
        count = _int_field(doc, "count", low=1, high=1_000_000, default=1)
        fake.inject_uncorrectable_ecc(gpu, count)
        return f"{count} uncorrectable ECC error(s) on gpu {gpu}"
    if kind == "thermal":
        on = doc.get("on", True)
        if not isinstance(on, bool):
            raise FaultSpecError(f"'on' must be true or false, got {on!r}")
        fake.set_thermal_throttle(gpu, on)
        return f"thermal throttling {'on' if on else 'off'} on gpu {gpu}"
    if kind == "gpu_lost":
        fake.lose_gpu(gpu)
        return f"gpu {gpu} fell off the bus"
    fake.restore_gpu(gpu)
    return f"gpu {gpu} restored"


def apply_fault_files(run_dir: Path, fake: FakeNVML) -> list[str]:
    """Apply and rename every pending fault file; returns what was applied, in name order."""
    directory = Path(run_dir) / FAULT_DIRNAME
    try:
        paths = sorted(
            p for p in directory.iterdir() if p.suffix == ".json" and not p.name.startswith(".")
        )
    except FileNotFoundError:
        return []
    done: list[str] = []
    for path in paths:
        try:
            what = apply_fault(fake, orjson.loads(path.read_bytes()))
        except (FaultSpecError, orjson.JSONDecodeError) as exc:
            log.error("simulated fault %s rejected: %s", path, exc)
            path.rename(path.with_name(path.name + ".rejected"))
            continue
        except FileNotFoundError:
            continue
        log.warning("simulated fault applied from %s: %s", path.name, what)
        path.rename(path.with_name(path.name + ".applied"))
        done.append(what)
    return done
