"""Logged generations for TRL's ``GRPOTrainer``: a generation batch is never generated twice.

One line after the trainer is built, before :func:`integrations.trl.snapshots.enable_snapshots`:
``enable_generation_log(trainer)``. Every batch ``_generate_and_score_completions`` returns is
written to RLGuard's write-ahead log (:mod:`recovery.wal`, ``<run_dir>/generations/rank-<r>/``)
before the optimisation sees it, keyed by ``(global step, generation index)`` with the RNG states
around it and the metrics, logs and tokens it added; it is COMPLETED once the last optimizer
step consuming it is committed. A process restarted in between reuses the PENDING entry
(metrics replayed, RNG states restored, TRL's ``_step`` and buffer rebuilt), so the run goes on
bit-identically; an entry that does not verify or was logged for other prompts, seed, cadence or
RNG states is marked FAILED with the reason and generated again. Each reuse appends
``generation_reused`` to ``<run_dir>/events.jsonl``, each regeneration ``generation_redone``
(:attr:`GenerationLog.reused` and :attr:`GenerationLog.redone` count them in the process).

It wraps ``GRPOTrainer._generate_and_score_completions`` and ``_prepare_inputs`` and reads its
``_step``, ``_metrics`` and ``_logs``, as pinned by :data:`GENERATION_LOG_TRL` and
:data:`GENERATION_LOG_TRANSFORMERS`; other versions are refused with a message naming them.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import random
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import ExportableState

from integrations import ENV_RUN_DIR, IntegrationError
from integrations.snapshot_owner import rank_dir
from integrations.trl import _check_range, _installed
from integrations.trl._generation_store import Cadence, GenerationStore, parse_entry_id
from integrations.trl.snapshots import rng_states
from recovery.supervision.events import EVENTS_FILE, append_event
from recovery.wal import WALEntry, WALError

log = logging.getLogger("rlguard.integrations.trl.generation_log")

# Tested with these (tests/integration/integrations/test_trl_generation_log.py): the private
# methods and attributes named in the module docstring change between TRL minor releases.
GENERATION_LOG_TRL = ("1.16.0", "1.17")
GENERATION_LOG_TRANSFORMERS = ("5.19.0", "5.20")
FORMAT = 1
# The record of a batch: these come back exactly as they were logged.
_REPLAYED = ("output", "rng_after", "metrics", "logs", "tokens")


def check_generation_log_versions() -> dict[str, str]:
    """The installed ``{"trl", "transformers"}``; raises :class:`IntegrationError` naming the
    version and the supported range when the hook is not known to hold."""
    versions = {"trl": _installed("trl"), "transformers": _installed("transformers")}
    _check_range("trl", versions["trl"], GENERATION_LOG_TRL)
    _check_range("transformers", versions["transformers"], GENERATION_LOG_TRANSFORMERS)
    return versions


# ---- RNG states ------------------------------------------------------------------------------


def set_rng_states(states: dict[str, Any]) -> None:
    """Put back states taken by :func:`integrations.trl.snapshots.rng_states`."""
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.random.set_rng_state(states["cpu"])
    if "cuda" in states and torch.cuda.is_available():
        cuda = states["cuda"]
        if isinstance(cuda, list):
            torch.cuda.random.set_rng_state_all(cuda)
        else:
            torch.cuda.random.set_rng_state(cuda)


def same_rng_states(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two RNG snapshots are the same states."""
    if a.keys() != b.keys() or a["python"] != b["python"]:
        return False
    na, nb = a["numpy"], b["numpy"]
    if na[0] != nb[0] or not np.array_equal(na[1], nb[1]) or tuple(na[2:]) != tuple(nb[2:]):
        return False
    if not torch.equal(a["cpu"], b["cpu"]):
        return False
    ca, cb = a.get("cuda"), b.get("cuda")
    if isinstance(ca, list) and isinstance(cb, list):
        return len(ca) == len(cb) and all(torch.equal(x, y) for x, y in zip(ca, cb, strict=True))
    return ca is cb is None or (
        isinstance(ca, torch.Tensor) and isinstance(cb, torch.Tensor) and torch.equal(ca, cb)
    )


# ---- what a generation changes besides its output ---------------------------------------------


def all_ranks_agree(ok: bool) -> bool:
    """True when ``ok`` holds on every rank of the process group (one all-reduce; ``ok`` itself
    for a single process). Every rank calls it once per generation: GRPO's generation gathers
    across ranks, so one rank reusing a logged batch while another generates would leave the
    generating rank waiting in a collective the other never joins."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return ok
    flag = torch.tensor([1 if ok else 0], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def inputs_digest(inputs: list[dict[str, Any]]) -> str:
    """A digest of the dataset rows a generation was asked for (tensors and arrays by value)."""

    def stable(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().numpy()
        if isinstance(value, np.ndarray):
            return [
                str(value.dtype),
                list(value.shape),
                hashlib.sha256(value.tobytes()).hexdigest(),
            ]
        return repr(value)

    text = json.dumps(inputs, sort_keys=True, default=stable)
    return hashlib.sha256(text.encode()).hexdigest()


def metric_changes(
    before: dict[str, list[Any]], after: dict[str, list[Any]]
) -> list[tuple[str, str, list[Any]]]:
    """What a generation did to ``GRPOTrainer._metrics[mode]``: ``(name, "extend", values)``
    where it appended, ``(name, "set", values)`` where it replaced the list (``num_tokens``)."""
    changes = []
    for name, values in after.items():
        old = before.get(name)
        if old is not None and values[: len(old)] == old:
            if len(values) > len(old):
                changes.append((name, "extend", list(values[len(old) :])))
        else:
            changes.append((name, "set", list(values)))
    return changes


def apply_metric_changes(metrics: dict[str, list[Any]], changes: list[Any]) -> None:
    """Replay :func:`metric_changes` on ``metrics``."""
    for name, how, values in changes:
        if how == "extend":
            metrics[name].extend(values)
        else:
            metrics[name] = list(values)


def _fresh_logs(logs: dict[str, Any]) -> dict[str, Any]:
    """Empty, unbounded stand-ins for ``GRPOTrainer._logs`` (bounded deques, so what a
    generation appended cannot be told from their contents afterwards)."""
    return {k: defaultdict(list) if isinstance(v, dict) else [] for k, v in logs.items()}


def _merge_logs(logs: dict[str, Any], added: dict[str, Any]) -> None:
    for key, values in added.items():
        if isinstance(values, dict):
            for name, items in values.items():
                logs[key][name].extend(items)
        else:
            logs[key].extend(values)


class GenerationMicroStep(TrainerCallback, ExportableState):
    """TRL's micro-step counter (``GRPOTrainer._step``) at the last optimizer step, exported
    with the Trainer's state (``stateful_callbacks``) so a resume continues it; TRL itself
    starts it at 0 in every process, which moves a resumed run's generations."""

    def __init__(self, micro_step: int = 0) -> None:
        self.micro_step = micro_step

    def state(self) -> dict[str, Any]:
        return {"args": {}, "attributes": {"micro_step": self.micro_step}}


# ---- the hook ----------------------------------------------------------------------------------


class GenerationLog(TrainerCallback):
    """Logs and reuses the generation batches of one ``GRPOTrainer`` (see the module
    docstring); made by :func:`enable_generation_log`."""

    # integrations.trl.snapshots: snapshots may fall inside a generation's span.
    keeps_generation_buffer = True

    def __init__(
        self,
        trainer: Trainer,
        store: GenerationStore,
        *,
        run_dir: Path | None,
        after_log: Callable[[int, int], None] | None = None,
    ) -> None:
        # GRPOTrainer's private attributes are read and set here: typed as what they are.
        self.trainer: Any = cast(Any, trainer)
        self.store = store
        self.events: Path | None = None if run_dir is None else run_dir / EVENTS_FILE
        self.after_log = after_log
        args = self.trainer.args
        self.cadence = Cadence(
            grad_accum=int(args.gradient_accumulation_steps),
            steps_per_generation=int(args.steps_per_generation),
            num_iterations=int(getattr(trainer, "num_iterations", 1) or 1),
        )
        self.logged = 0
        self.reused = 0
        self.redone = 0
        self._open: dict[str, int] = {}  # PENDING entry -> the last step that consumes it
        self._restore_rng: dict[str, Any] | None = None
        self._generate = self.trainer._generate_and_score_completions
        self._prepare = self.trainer._prepare_inputs
        self.trainer._generate_and_score_completions = self._generate_logged
        self.trainer._prepare_inputs = self._prepare_inputs

    # ---- the wrapped methods ---------------------------------------------------------------

    def _prepare_inputs(self, generation_batch: Any) -> Any:
        try:
            return self._prepare(generation_batch)
        finally:
            # A buffer rebuilt from the log: TRL shuffled it with the states it was made
            # with; the step goes on with the states of the committed step it resumed from.
            if self._restore_rng is not None:
                set_rng_states(self._restore_rng)
                self._restore_rng = None

    def _generate_logged(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        trainer = self.trainer
        if not trainer.model.training:
            output: dict[str, Any] = self._generate(inputs)
            return output  # evaluation: nothing to resume
        micro = int(trainer._step)
        start = self.cadence.generation_start(micro)
        step, index = self.cadence.key(start)
        rebuild = micro != start  # a buffer lost by a resume inside its span
        digest = inputs_digest(inputs)
        entry = self.store.latest(step, index)
        if entry is not None and entry.status.value in ("pending", "executing"):
            reused = self._try_reuse(entry, digest, rebuild)
            if reused is not None:
                return reused
        else:
            all_ranks_agree(False)  # this rank generates, so every rank does (one call each)
            if entry is not None and entry.status.value == "completed":
                # Resumed from before a step that was committed (its newer state was lost).
                self._redone(step, index, "its step was committed; resumed from an older state")
            elif rebuild:
                self._redone(step, index, "the buffered generation is not in the log")
        return self._generate_and_log(inputs, step, index, digest)

    def _try_reuse(self, entry: WALEntry, digest: str, rebuild: bool) -> dict[str, Any] | None:
        step, index, _ = parse_entry_id(entry.entry_id) or (0, 0, 0)
        reason: str | None
        try:
            record = self._load(self.store.read(entry))
        except (WALError, OSError, RuntimeError, ValueError, EOFError) as exc:
            reason = f"its data does not verify: {exc}"
        else:
            reason = self._mismatch(record, digest, rebuild)
        if not all_ranks_agree(reason is None) and reason is None:
            reason = "another rank has no usable logged batch of this step: all generate again"
        if reason is not None:
            log.warning("not reusing generation %s: %s", entry.entry_id, reason)
            self.store.fail(entry, reason)
            self._open.pop(entry.entry_id, None)  # FAILED stays FAILED: never completed
            self._redone(step, index, reason)
            return None
        trainer = self.trainer
        if rebuild:
            self._restore_rng = rng_states(trainer.args.world_size > 1)
        else:
            apply_metric_changes(trainer._metrics["train"], record["metrics"])
            _merge_logs(trainer._logs, record["logs"])
            trainer.state.num_input_tokens_seen += record["tokens"]
        set_rng_states(record["rng_after"])
        self._open[entry.entry_id] = self.cadence.last_step(step, index)
        self.reused += 1
        log.warning(
            "reused the logged generation of step %d (index %d, %s): not generated again",
            step, index, entry.entry_id,
        )  # fmt: skip
        self._event("generation_reused", step=step, index=index, entry=entry.entry_id,
                    buffered=rebuild)  # fmt: skip
        output: dict[str, Any] = record["output"]
        return output

    def _mismatch(self, record: dict[str, Any], digest: str, rebuild: bool) -> str | None:
        trainer = self.trainer
        if record.get("format") != FORMAT:
            return f"format {record.get('format')!r}, this reads {FORMAT}"
        if record["inputs"] != digest:
            return "it was generated for other prompts"
        if record["seed"] != trainer.args.seed:
            return f"it was generated with seed {record['seed']}, this run has {trainer.args.seed}"
        if tuple(record["cadence"]) != self._cadence_tuple():
            return f"it was generated with the cadence {tuple(record['cadence'])}"
        if not rebuild and not same_rng_states(
            record["rng_before"], rng_states(trainer.args.world_size > 1)
        ):
            return "the random states now are not the ones it was generated with"
        return None

    def _generate_and_log(
        self, inputs: list[dict[str, Any]], step: int, index: int, digest: str
    ) -> dict[str, Any]:
        trainer = self.trainer
        distributed = trainer.args.world_size > 1
        before = rng_states(distributed)
        metrics = trainer._metrics["train"]
        metrics_before = {k: list(v) for k, v in metrics.items()}
        tokens_before = trainer.state.num_input_tokens_seen
        logs, added = trainer._logs, _fresh_logs(trainer._logs)
        trainer._logs = added
        try:
            output: dict[str, Any] = self._generate(inputs)
        finally:
            trainer._logs = logs
            _merge_logs(logs, added)
        record = {
            "format": FORMAT,
            "step": step,
            "index": index,
            "inputs": digest,
            "seed": trainer.args.seed,
            "cadence": self._cadence_tuple(),
            "rng_before": before,
            "rng_after": rng_states(distributed),
            "output": output,
            "metrics": metric_changes(metrics_before, trainer._metrics["train"]),
            "logs": {k: dict(v) if isinstance(v, dict) else v for k, v in added.items()},
            "tokens": trainer.state.num_input_tokens_seen - tokens_before,
        }
        buffer = io.BytesIO()
        torch.save(record, buffer)
        entry = self.store.log(step, index, buffer.getvalue())
        self._open[entry.entry_id] = self.cadence.last_step(step, index)
        self.logged += 1
        if self.after_log is not None:
            self.after_log(step, index)
        return output

    def _load(self, data: bytes) -> dict[str, Any]:
        # Our own file, written by this job and checked against the WAL's SHA-256 before it
        # is read: it holds Python RNG states and completion texts as well as tensors.
        device = torch.device(self.trainer.args.device)
        # torch.load cannot map to "cpu:0", which accelerate names the CPU when ranks are set.
        where = "cpu" if device.type == "cpu" else device
        loaded = torch.load(io.BytesIO(data), map_location=where, weights_only=False)
        if not isinstance(loaded, dict) or any(k not in loaded for k in _REPLAYED):
            raise ValueError("not a generation record")
        record: dict[str, Any] = loaded
        return record

    def _cadence_tuple(self) -> tuple[int, int, int]:
        c = self.cadence
        return c.grad_accum, c.steps_per_generation, c.num_iterations

    def _redone(self, step: int, index: int, reason: str) -> None:
        self.redone += 1
        self._event("generation_redone", step=step, index=index, reason=reason)

    def _event(self, kind: str, **fields: Any) -> None:
        if self.events is not None:
            try:
                append_event(self.events, kind, **fields)
            except OSError as exc:
                log.warning("cannot append %s to %s: %s", kind, self.events, exc)

    # ---- commits ---------------------------------------------------------------------------

    def _counter(self) -> GenerationMicroStep | None:
        for cb in self.trainer.callback_handler.callbacks:
            if isinstance(cb, GenerationMicroStep):
                return cb
        return None

    def _snapshots_committed(self) -> int:
        for cb in self.trainer.callback_handler.callbacks:
            committed = getattr(cb, "committed_step", None)
            if isinstance(committed, int):
                return committed
        return 0

    def _complete_through(self, step: int) -> None:
        done = [eid for eid, last in self._open.items() if last <= step]
        if done:
            self.store.complete(done)
            for eid in done:
                del self._open[eid]

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        callbacks: Any = state.stateful_callbacks or {}
        saved = callbacks.get(GenerationMicroStep.__name__)
        if isinstance(saved, list):
            saved = saved[-1] if saved else None
        micro = (saved or {}).get("attributes", {}).get("micro_step")
        if not isinstance(micro, int):
            micro = state.global_step * self.cadence.grad_accum
        self.trainer._step = micro
        counter = self._counter()
        if counter is not None:
            counter.micro_step = micro
        for entry in self.store.pending():
            parsed = parse_entry_id(entry.entry_id)
            if parsed is not None:
                self._open[entry.entry_id] = self.cadence.last_step(parsed[0], parsed[1])
        # Resumed from a committed step: what it consumed is never needed again.
        self._complete_through(state.global_step)

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._complete_through(self._snapshots_committed())

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        counter = self._counter()
        if counter is not None:  # before this step's snapshot or save reads it
            counter.micro_step = int(self.trainer._step)

    def on_log(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._complete_through(self._snapshots_committed())

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._complete_through(max(state.global_step, self._snapshots_committed()))

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._complete_through(self._snapshots_committed())
        self.store.close()


def enable_generation_log(
    trainer: Trainer,
    *,
    run_dir: str | os.PathLike[str] | None = None,
    rank: int | None = None,
    directory: str | os.PathLike[str] | None = None,
    sync: bool = True,
    after_log: Callable[[int, int], None] | None = None,
) -> GenerationLog:
    """Log every generation batch of the ``GRPOTrainer`` ``trainer`` and reuse a logged one
    after a restart (see the module docstring); call it before ``enable_snapshots``.

    ``directory`` defaults to ``<run_dir>/generations/rank-<rank>``; ``run_dir`` and ``rank``
    default to what ``rlguard launch`` sets (``RLGUARD_RUN_DIR``, ``RANK``). ``sync=False``
    skips the fsyncs (a batch still survives a killed process, not a power loss).
    ``after_log`` is called with ``(step, index)`` once a batch is durable, before the
    optimisation uses it (tests inject faults there). Raises :class:`IntegrationError` naming
    the unsupported version, trainer, setting or directory.
    """
    check_generation_log_versions()
    if not callable(getattr(trainer, "_generate_and_score_completions", None)) or not hasattr(
        trainer, "_buffered_inputs"
    ):
        raise IntegrationError(
            f"enable_generation_log needs TRL's GRPOTrainer, got {type(trainer).__name__}"
        )
    if getattr(trainer, "environment_factories", None) is not None:
        raise IntegrationError(
            "enable_generation_log cannot replay generations made with environment_factories: "
            "the environments' own state would not follow a reused batch"
        )
    if any(isinstance(cb, GenerationLog) for cb in trainer.callback_handler.callbacks):
        raise IntegrationError("enable_generation_log was already called for this trainer")
    env_dir = os.environ.get(ENV_RUN_DIR) or None
    run = Path(run_dir) if run_dir is not None else Path(env_dir) if env_dir else None
    if directory is None:
        if run is None:
            raise IntegrationError(
                f"enable_generation_log needs a run directory: run under rlguard launch (it "
                f"sets {ENV_RUN_DIR}) or pass run_dir= or directory="
            )
        rank = rank if rank is not None else int(os.environ.get("RANK", "0") or 0)
        directory = rank_dir(run / "generations", rank)
    store = GenerationStore(Path(directory), sync=sync)
    callback = GenerationLog(trainer, store, run_dir=run, after_log=after_log)
    trainer.add_callback(GenerationMicroStep())
    trainer.add_callback(callback)
    return callback
