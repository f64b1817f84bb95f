"""Every-step snapshots for any ``transformers.Trainer`` (TRL's ``GRPOTrainer`` included).

One line after the trainer is built, the same path given to ``train``::

    snapshots = enable_snapshots(trainer, resume_from_checkpoint=args.resume_from_checkpoint)
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)

Every ``every`` optimizer steps, where the Trainer itself saves, the callback copies what the
Trainer's checkpoint holds into host memory: the launcher's shared-memory segment
(``RLGUARD_SNAPSHOT_SHM``, persisted by the launcher), else the checkpoint engine's buffers
written to ``<run_dir>/snapshots/rank-<r>/`` (a fallback logged once and counted in the
heartbeat as a snapshot persist error). When a snapshot is the newest committed state, a
restart names ``<output_dir>/rlguard-snapshot-<step>`` and :func:`enable_snapshots` writes it
there in the Trainer's checkpoint layout (memory first, then disk; checksums checked)
before ``train`` reads it: the run continues bit-identically. :data:`SNAPSHOT_TRANSFORMERS` and
:data:`SNAPSHOT_TRL` pin that layout; other versions are refused with a message naming them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle
import random
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import ExportableState

from integrations import ENV_RUN_DIR, IntegrationError
from integrations.snapshot_owner import ENV_SNAPSHOT_SHM, disk_root, rank_dir
from integrations.trl import SNAPSHOT_RESUME_PREFIX, _check_range, _installed
from integrations.trl.rank_rounds import RankRounds, rank_rounds
from recovery.checkpoint import atomic
from recovery.checkpoint.engine import CheckpointEngine, SaveHandle
from recovery.checkpoint.errors import CheckpointBusy, CheckpointCorrupt, CheckpointError
from recovery.checkpoint.layout import MARKER, list_dirs
from recovery.checkpoint.memory_snapshots import MemorySnapshotWriter, SnapshotSaved
from recovery.checkpoint.persister import error_text, read_status
from recovery.checkpoint.reader import CheckpointInfo, CheckpointReader
from recovery.checkpoint.segment_owner import owner_alive, owner_pid
from recovery.checkpoint.version import VersionVector
from recovery.report import HeartbeatReporter

log = logging.getLogger("rlguard.integrations.trl.snapshots")

# Tested: the resume is bit-identical with these (tests/integration/integrations/
# test_trl_snapshots.py). The Trainer's checkpoint layout and its data skip have changed
# between minor releases; the next one is not assumed to keep them.
SNAPSHOT_TRANSFORMERS = ("5.19.0", "5.20")
SNAPSHOT_TRL = ("1.16.0", "1.17")

RESUME_PREFIX = SNAPSHOT_RESUME_PREFIX
_RESUME_RE = re.compile(rf"^{RESUME_PREFIX}(\d+)$")
_MATERIALIZED = "RLGUARD_MATERIALIZED"
COMPONENTS = (
    "model",
    "optimizer",
    "lr_scheduler",
    "scaler",
    "rng",
    "rng_file",
    "trainer_state",
    "step",
)


def check_snapshot_versions() -> dict[str, str]:
    """The installed transformers (and TRL, when installed); raises :class:`IntegrationError`
    naming the version and the supported range when the resume hook is not known to hold."""
    versions = {"transformers": _installed("transformers")}
    _check_range("transformers", versions["transformers"], SNAPSHOT_TRANSFORMERS)
    try:
        versions["trl"] = _installed("trl")
    except IntegrationError:
        return versions  # a plain transformers.Trainer
    _check_range("trl", versions["trl"], SNAPSHOT_TRL)
    return versions


def resume_dir(output_dir: Path, step: int) -> Path:
    """The directory the launcher names for resuming from the snapshot of ``step``."""
    return output_dir / f"{RESUME_PREFIX}{step}"


def _check_generation_cadence(trainer: Trainer) -> None:
    """GRPO keeps generations across optimizer steps when it generates less often than every
    step; those buffered generations are not in a snapshot, so such a resume would differ."""
    args = trainer.args
    per_generation = getattr(args, "steps_per_generation", None)
    if per_generation is None:
        return
    if any(
        getattr(cb, "keeps_generation_buffer", False) for cb in trainer.callback_handler.callbacks
    ):
        return  # integrations.trl.generation_log rebuilds the buffer from its logged batch
    every = per_generation * int(getattr(args, "num_iterations", 1) or 1)
    if every != args.gradient_accumulation_steps:
        raise IntegrationError(
            f"memory snapshots need a generation every optimizer step: steps_per_generation "
            f"({per_generation}) x num_iterations ({getattr(args, 'num_iterations', 1)}) must "
            f"equal gradient_accumulation_steps ({args.gradient_accumulation_steps})"
        )


# ---- what a snapshot holds ------------------------------------------------------------------


def rng_states(distributed: bool) -> dict[str, Any]:
    """Every RNG state, as the Trainer saves them (``rng_state.pth``; with several processes
    every CUDA device's state, as the Trainer's distributed resume expects)."""
    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cpu": torch.random.get_rng_state(),
    }
    if torch.cuda.is_available():
        cuda = torch.cuda.random
        states["cuda"] = cuda.get_rng_state_all() if distributed else cuda.get_rng_state()
    return states


def rng_file_name(world_size: int, process_index: int) -> str:
    """The RNG file the Trainer's resume reads for this process."""
    return "rng_state.pth" if world_size <= 1 else f"rng_state_{process_index}.pth"


def trainer_state_json(trainer: Trainer) -> str:
    """``trainer_state.json`` as the Trainer would write it now: the callbacks' exported state
    recorded and the floating-point operations not yet folded in counted (``store_flos``)."""
    data = dataclasses.asdict(trainer.state)
    callbacks = trainer.callback_handler.callbacks + [trainer.control]
    for cb in callbacks:
        if isinstance(cb, ExportableState):
            name = type(cb).__name__
            if isinstance(data["stateful_callbacks"].get(name), list):
                data["stateful_callbacks"][name].append(cb.state())
            else:
                data["stateful_callbacks"][name] = cb.state()
    data["total_flos"] = trainer.state.total_flos + float(getattr(trainer, "current_flos", 0))
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def capture(trainer: Trainer) -> dict[str, Any]:
    """The components of a snapshot of ``trainer`` now (tensors by reference: the writer
    copies them). Small Python objects travel pickled, exactly as the Trainer's files hold them."""
    scaler = getattr(trainer.accelerator, "scaler", None)
    model, optimizer, scheduler = trainer.model, trainer.optimizer, trainer.lr_scheduler
    if model is None or optimizer is None or scheduler is None:
        raise IntegrationError("a snapshot needs the trainer's model, optimizer and scheduler")
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "lr_scheduler": pickle.dumps(scheduler.state_dict()),
        "scaler": None if scaler is None else pickle.dumps(scaler.state_dict()),
        "rng": pickle.dumps(rng_states(trainer.args.world_size > 1)),
        "rng_file": rng_file_name(trainer.args.world_size, trainer.args.process_index),
        "trainer_state": trainer_state_json(trainer),
        "step": trainer.state.global_step,
    }


# ---- turning a snapshot back into the Trainer's checkpoint layout --------------------------


def _cloned(value: Any) -> Any:
    """``value`` with every tensor copied out of the snapshot's buffer (``torch.save`` of a view
    writes its whole storage)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _cloned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cloned(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_cloned(v) for v in value)
    return value


def find_snapshot(roots: list[Path], step: int) -> tuple[CheckpointInfo, dict[str, Any]] | None:
    """The snapshot of ``step`` from the first of ``roots`` holding one that verifies."""
    for root in roots:
        try:
            candidates = sorted(list_dirs(root), reverse=True)
        except FileNotFoundError:
            continue
        for _seq, path in candidates:
            try:
                body = atomic.read_marker(path, MARKER)
                info = CheckpointInfo.from_marker(path, body)
                if info.version.training_step != step:
                    continue
                return info, CheckpointReader(root).load(info, verify="full")
            except (CheckpointCorrupt, OSError) as exc:
                log.warning("not resuming from snapshot %s: %s", path, exc)
    return None


def write_trainer_checkpoint(
    state: Mapping[str, Any], target: Path, *, shared: bool = False
) -> None:
    """Write ``state`` (a loaded snapshot) as the Trainer's checkpoint directory ``target``,
    atomically (a temporary directory renamed; a marker of ours inside, last).

    ``shared``: several ranks write into one ``target``, each its own ``rng_state_<r>.pth``
    beside the same model, optimizer, scheduler and state (identical on every data-parallel
    rank): each file is moved in by its own atomic rename, so whichever rank's copy lands, a
    reader sees a whole file, and each rank has all it reads once its own moves are done."""
    from safetensors.torch import save_file

    tmp = atomic.make_tmp_dir(target.parent, target.name)
    try:
        weights = {k: v.clone().contiguous() for k, v in state["model"].items()}
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        torch.save(_cloned(state["optimizer"]), tmp / "optimizer.pt")
        torch.save(pickle.loads(state["lr_scheduler"]), tmp / "scheduler.pt")
        if state["scaler"] is not None:
            torch.save(pickle.loads(state["scaler"]), tmp / "scaler.pt")
        torch.save(pickle.loads(state["rng"]), tmp / state["rng_file"])
        (tmp / "trainer_state.json").write_text(state["trainer_state"], encoding="utf-8")
        (tmp / _MATERIALIZED).write_text(str(state["step"]), encoding="utf-8")
        if shared:
            target.mkdir(exist_ok=True)
            for name in sorted(p.name for p in tmp.iterdir() if p.name != _MATERIALIZED):
                os.replace(tmp / name, target / name)
            return
        if target.exists():
            shutil.rmtree(target)
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def materialize_resume(
    resume_from: str | os.PathLike[str], roots: list[Path], *, shared: bool = False
) -> Path | None:
    """When ``resume_from`` names a snapshot (``rlguard-snapshot-<step>``), write that snapshot
    there in the Trainer's layout (older ones of ours beside it are removed) and return the
    path; None for any other path. Raises :class:`IntegrationError` when no copy verifies.
    ``shared``: one of several ranks, each writing its files into the same directory (see
    :func:`write_trainer_checkpoint`); always written again (another rank's leftovers from an
    earlier start are no proof that this rank's files are there)."""
    target = Path(resume_from)
    match = _RESUME_RE.match(target.name)
    if match is None:
        return None
    step = int(match.group(1))
    for stale in target.parent.glob(f"{RESUME_PREFIX}*"):
        if stale != target:
            shutil.rmtree(stale, ignore_errors=True)
    if not shared and (target / _MATERIALIZED).exists():
        return target  # written by a start that died before training resumed
    found = find_snapshot(roots, step)
    if found is None:
        raise IntegrationError(
            f"no snapshot of step {step} verifies in {', '.join(str(r) for r in roots)}: "
            f"cannot resume from {target}"
        )
    info, state = found
    write_trainer_checkpoint(state, target, shared=shared)
    log.warning("resuming from the snapshot of step %d (%s)", step, info.path)
    return target


# ---- the callback ---------------------------------------------------------------------------


class TrainerSnapshots(TrainerCallback):
    """Takes the snapshots of one Trainer (see the module docstring); made by
    :func:`enable_snapshots`."""

    def __init__(
        self,
        trainer: Trainer,
        *,
        run_dir: Path,
        rank: int,
        segment: Path | None,
        every: int = 1,
        keep: int = 3,
        shm_limit_bytes: int | None = None,
        after_copy: Callable[[int], None] | None = None,
        after_snapshot: Callable[[int], None] | None = None,
    ) -> None:
        self.trainer = trainer
        self.rank = rank
        self.after_snapshot = after_snapshot
        self.rounds: RankRounds | None = None
        self.every = every
        self.disk = rank_dir(disk_root(run_dir), rank)
        self.segment = segment
        self.memory: MemorySnapshotWriter | None = None
        self.after_copy = after_copy
        self._step = 0
        if segment is not None:
            self.memory = MemorySnapshotWriter(
                rank_dir(segment, rank),
                limit_bytes=shm_limit_bytes,
                seq_after=[self.disk],
                after_copy=lambda _seq: self._after_copy(),
            )
        self.engine: CheckpointEngine | None = None
        self.keep = keep
        self._pending: SaveHandle | None = None
        self._errors_seen = 0
        self.last: SnapshotSaved | SaveHandle | None = None
        self.fallback_reason: str | None = None
        self._committed_step = 0
        self._resumed_step = 0
        self._held: tuple[int, SnapshotSaved | SaveHandle] | None = None

    @property
    def committed_step(self) -> int:
        """The newest step whose snapshot is committed (a memory snapshot once its save
        returned, a disk one once the checkpoint engine has written it), or the step this run
        resumed from. With several ranks: the newest step a round committed on every rank
        (what the logged generations of the steps up to it wait for)."""
        if self.rounds is not None:
            return max(self._resumed_step, self.rounds.committed or 0)
        pending = self._pending
        if pending is not None and pending.done and pending.error is None:
            self._committed_step = max(self._committed_step, pending.version.training_step)
        return self._committed_step

    def _after_copy(self) -> None:
        if self.after_copy is not None:
            self.after_copy(self._step)

    @property
    def reporter(self) -> HeartbeatReporter | None:
        """The heartbeat of this rank, when an RLGuardCallback runs beside us."""
        for cb in self.trainer.callback_handler.callbacks:
            reporter = getattr(cb, "reporter", None)
            if isinstance(reporter, HeartbeatReporter):
                return reporter
        return None

    def _record_error(self, directory: Path, error: str) -> None:
        """Count a failure of the snapshot path in the heartbeat (``snapshot_persist_errors``,
        not the job's checkpoint errors: training goes on with the snapshots it still has)."""
        log.warning("snapshot path fault in %s: %s", directory, error)
        reporter = self.reporter
        if reporter is not None:
            reporter.record_snapshot_persist_error(str(directory), error)

    # ---- when ----------------------------------------------------------------------------

    def _maybe_take(self, state: TrainerState) -> None:
        step = state.global_step
        if step <= self._step or step % self.every:
            return
        self._step = step
        self.take(step)

    def on_log(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._maybe_take(state)

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._maybe_take(state)

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._maybe_take(state)

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._step = state.global_step  # resumed: that step is already a snapshot
        self._committed_step = max(self._committed_step, state.global_step)
        self._resumed_step = state.global_step
        if self.rounds is None:  # several ranks under rlguard launch: commit steps together
            self.rounds = rank_rounds(self.rank, args.world_size, state.global_step, self._holds)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._maybe_take(state)
        if self.rounds is not None:
            self.rounds.close()
        if self.engine is not None:
            self.engine.close()
        if self.memory is not None:
            self.memory.close()

    # ---- how -----------------------------------------------------------------------------

    def take(self, step: int) -> None:
        """Snapshot the trainer now as step ``step`` (into memory when it can, else to disk);
        with several ranks, then take part in the round that commits ``step`` on all of them."""
        self._store(step)
        if self.after_snapshot is not None:
            self.after_snapshot(step)
        if self.rounds is not None:
            self.rounds.commit(step)

    def _holds(self, step: int) -> bool:
        """Whether this rank's snapshot of ``step`` is committed locally (waits for a disk
        snapshot still being written)."""
        held = self._held
        if held is None or held[0] != step:
            return False
        saved = held[1]
        if isinstance(saved, SaveHandle):
            saved.wait(60.0)  # raises the write's error: the round aborts, naming it
        return True

    def _store(self, step: int) -> None:
        self._check_persist_status()
        components = capture(self.trainer)
        version = VersionVector(step, step)
        if self.memory is not None and self.segment is not None:
            if not owner_alive(self.segment):
                self._fall_back(
                    f"the owner of {self.segment} (pid {owner_pid(self.segment)}) is gone: "
                    f"nobody persists the memory snapshots"
                )
            else:
                try:
                    self.last = self.memory.save(components, version=version)
                    self._committed_step = step
                    self._held = (step, self.last)
                    return
                except (CheckpointError, OSError) as exc:
                    self._fall_back(f"memory snapshot of step {step} refused: {exc}")
        self._save_to_disk(components, version)

    def _fall_back(self, reason: str) -> None:
        log.error("%s; snapshots go to %s only from now on", reason, self.disk)
        self.fallback_reason = reason
        self._record_error(self.segment if self.segment is not None else self.disk, reason)
        if self.memory is not None:
            self.memory.close()
        self.memory = None

    def _save_to_disk(self, components: Mapping[str, Any], version: VersionVector) -> None:
        _ = self.committed_step  # the finished save's step, before its handle is replaced
        if self._pending is not None and self._pending.done and self._pending.error is not None:
            self._record_error(self.disk, error_text(self._pending.error))
            self._pending = None
        if self.engine is None:
            self.engine = CheckpointEngine(
                self.disk,
                keep=self.keep,
                when_busy="refuse",
                layers=dict.fromkeys(COMPONENTS, "core"),
                required_core=("model", "optimizer"),
            )
        try:
            self._pending = self.engine.save(components, version=version)
            self.last = self._pending
            self._held = (version.training_step, self._pending)
        except CheckpointBusy:
            log.info(
                "disk snapshot of step %d skipped: the previous one is still writing",
                version.training_step,
            )

    def _check_persist_status(self) -> None:
        """Report the owner's failures to persist our memory snapshots (disk full, unwritable)."""
        if self.memory is None:
            return
        status = read_status(self.memory.root)
        errors, error = status.get("errors", 0), status.get("error")
        directory = Path(str(status.get("dir") or self.disk))
        if isinstance(errors, int) and errors > self._errors_seen:
            for _ in range(errors - self._errors_seen):
                self._record_error(directory, str(error or "the launcher could not persist it"))
            self._errors_seen = errors


def enable_snapshots(
    trainer: Trainer,
    *,
    resume_from_checkpoint: str | os.PathLike[str] | None = None,
    run_dir: str | os.PathLike[str] | None = None,
    rank: int | None = None,
    every: int = 1,
    keep: int = 3,
    shm_limit_bytes: int | None = None,
    after_copy: Callable[[int], None] | None = None,
    after_snapshot: Callable[[int], None] | None = None,
) -> TrainerSnapshots:
    """Snapshot ``trainer`` every ``every`` optimizer steps (see the module docstring) and, when
    ``resume_from_checkpoint`` names a snapshot, write it there for ``train`` to resume from.

    ``run_dir`` and ``rank`` default to what ``rlguard launch`` sets (``RLGUARD_RUN_DIR``,
    ``RANK``); ``keep``: snapshots kept on disk; ``shm_limit_bytes``: the most the memory
    snapshots may take (default: what ``/dev/shm`` has free); ``after_copy``: called with the
    step after each memory copy, before its checksum and marker, ``after_snapshot`` after each
    snapshot is committed locally, before its round with the other ranks (tests inject faults
    there). With several ranks under ``rlguard launch --nproc N`` a step is committed only once
    every rank holds it (:mod:`integrations.trl.rank_rounds`).
    Raises :class:`IntegrationError` on an unsupported version or setting, naming it.
    """
    check_snapshot_versions()
    _check_generation_cadence(trainer)
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise IntegrationError(f"every must be an int >= 1, got {every!r}")
    directory = run_dir if run_dir is not None else os.environ.get(ENV_RUN_DIR)
    if not directory:
        raise IntegrationError(
            f"enable_snapshots needs a run directory: run under rlguard launch (it sets "
            f"{ENV_RUN_DIR}) or pass run_dir="
        )
    rank = rank if rank is not None else int(os.environ.get("RANK", "0") or 0)
    shm = os.environ.get(ENV_SNAPSHOT_SHM)
    segment = Path(shm) if shm else None
    callback = TrainerSnapshots(
        trainer,
        run_dir=Path(directory),
        rank=rank,
        segment=segment,
        every=every,
        keep=keep,
        shm_limit_bytes=shm_limit_bytes,
        after_copy=after_copy,
        after_snapshot=after_snapshot,
    )
    if resume_from_checkpoint is not None:
        roots = [rank_dir(segment, rank)] if segment is not None else []
        shared = trainer.args.world_size > 1
        materialize_resume(resume_from_checkpoint, [*roots, callback.disk], shared=shared)
    trainer.add_callback(callback)
    return callback
