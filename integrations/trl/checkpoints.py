"""Which ``checkpoint-N`` directories of a Hugging Face Trainer run are complete.

The Trainer (and TRL's ``GRPOTrainer``, which inherits its saving) writes the files of
``<output_dir>/checkpoint-N`` straight into that directory, with no temporary name and no rename,
and ``resume_from_checkpoint=True`` takes the highest-numbered one whatever it holds. Measured with
trl 1.16 / transformers 5.24: with ``optimizer.pt`` or ``scheduler.pt`` missing it resumes
*silently* with a fresh optimizer and learning-rate schedule; with ``trainer_state.json`` or the
weights missing it stops with an error. So a kill during a save leaves a directory that either
breaks the resume or, worse, quietly changes the run.

After the Trainer has written ``checkpoint-N`` (its ``on_save`` callback), :func:`seal_checkpoint`
writes the checkpoint engine's completion marker into it (:mod:`recovery.checkpoint.atomic`:
every file's size and checksum, the version vector, and a checksum of the marker itself), and
:func:`newest_complete_checkpoint` resumes only from a directory whose marker verifies. Imports
nothing heavy: the launcher calls it on every restart.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recovery.checkpoint.atomic import seal_dir, verify_committed_dir
from recovery.checkpoint.errors import CheckpointCorrupt

log = logging.getLogger("rlguard.integrations.trl")

# Named for us, not for the Trainer, which ignores unknown files in a checkpoint directory.
MARKER_NAME = "RLGUARD_COMMITTED"
# CRC-32: a torn or truncated file is what this guards against, and it is several times cheaper
# than SHA-256 on multi-gigabyte weights and optimizer states.
CHECKSUM = "crc32"
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


@dataclass(frozen=True)
class CompleteCheckpoint:
    """A ``checkpoint-N`` directory whose marker and files verified."""

    path: Path
    global_step: int
    inference_version: int


def seal_checkpoint(
    checkpoint_dir: Path, *, global_step: int, inference_version: int, framework: dict[str, str]
) -> dict[str, Any]:
    """Write ``checkpoint_dir``'s completion marker; returns its body.

    ``inference_version`` is the weight version the rollouts used when it was taken (in GRPO
    without a separate inference server, the training step itself). ``framework`` records the
    package versions that wrote it. Raises ``OSError`` or a ``RecoveryError`` when the storage
    refuses; the directory then has no valid marker and is never resumed from.
    """
    return seal_dir(
        checkpoint_dir,
        marker_name=MARKER_NAME,
        checksum=CHECKSUM,
        metadata={
            "kind": "hf_trainer_checkpoint",
            "global_step": global_step,
            "version": {"training_step": global_step, "inference_version": inference_version},
            "created_at": time.time(),
            "framework": dict(framework),
        },
    )


def verify_checkpoint(checkpoint_dir: Path) -> CompleteCheckpoint:
    """Check ``checkpoint_dir``'s marker and every file it lists; raises ``CheckpointCorrupt``
    naming the first problem (no marker, a missing, short or changed file, a marker for
    another step)."""
    match = _CHECKPOINT_RE.match(checkpoint_dir.name)
    if match is None:
        raise CheckpointCorrupt(f"{checkpoint_dir.name}: not a checkpoint-N directory")
    body = verify_committed_dir(checkpoint_dir, MARKER_NAME)
    meta = body.get("metadata") or {}
    step = int(match.group(1))
    if meta.get("global_step") != step:
        raise CheckpointCorrupt(
            f"{checkpoint_dir.name}: marker is for step {meta.get('global_step')!r}, not {step}"
        )
    version = meta.get("version") or {}
    return CompleteCheckpoint(checkpoint_dir, step, int(version.get("inference_version", step)))


def checkpoint_dirs(output_dir: Path) -> list[tuple[int, Path]]:
    """``(N, path)`` of every ``checkpoint-N`` directory in ``output_dir``, newest first."""
    try:
        entries = list(output_dir.iterdir())
    except FileNotFoundError:
        return []
    found = [
        (int(m.group(1)), p)
        for p in entries
        if (m := _CHECKPOINT_RE.match(p.name)) is not None and p.is_dir()
    ]
    return sorted(found, reverse=True)


def newest_complete_checkpoint(output_dir: Path) -> CompleteCheckpoint | None:
    """The highest-numbered ``checkpoint-N`` under ``output_dir`` whose marker verifies; None if
    there is none. Each directory passed over is logged with the reason."""
    for _, path in checkpoint_dirs(output_dir):
        try:
            return verify_checkpoint(path)
        except CheckpointCorrupt as exc:
            log.warning("not resuming from %s: %s", path, exc)
    return None
