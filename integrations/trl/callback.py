"""``RLGuardCallback``: a TRL ``GRPOTrainer`` reports to RLGuard and obeys it.

One line in the training script, ``GRPOTrainer(..., callbacks=[RLGuardCallback()])``, and under
``rlguard launch`` each rank:

* writes its heartbeat (:class:`recovery.report.HeartbeatReporter`, role ``trainer``, rank from
  ``RANK``): phase, step, tokens and completions generated, TRL's GRPO metrics, its own faults
  (what each field holds: ``docs/integrations.md``, "What it reports");
* declares the drill injection points ``oom`` and ``disk-full`` (:mod:`recovery.drill_points`);
* seals every ``checkpoint-N`` with the checkpoint engine's completion marker, so a restart
  resumes only from a complete checkpoint;
* obeys the job's control file: under ``SAFE_MODE`` it saves at the step boundary, reports
  ``SAFE_MODE`` and waits, heartbeat alive, until the job is released, then goes on.

``ROLLOUT`` is seen by wrapping the policy model's ``generate`` (TRL's transformers path only;
with vLLM or continuous batching the whole step is ``TRAIN``). The TRL version is checked
(:data:`integrations.trl.SUPPORTED_TRL`) when the callback is created.
"""

from __future__ import annotations

import errno
import functools
import logging
import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from integrations import ENV_JOB, ENV_ROLE, ENV_RUN_DIR, IntegrationError
from integrations.trl import check_versions
from integrations.trl.checkpoints import seal_checkpoint
from recovery import drill_points
from recovery.control import ControlError, ControlMode, read_control
from recovery.errors import RecoveryError
from recovery.report import HeartbeatReporter, heartbeat_path, read_heartbeat

log = logging.getLogger("rlguard.integrations.trl")

# TRL's ``on_log`` keys -> the job signals the agent forwards (docs/metrics.md).
GRPO_SIGNALS: Mapping[str, str] = {
    "reward": "grpo_reward_mean",
    "reward_std": "grpo_reward_std",
    "kl": "grpo_kl",
    "completions/mean_length": "grpo_completion_length_mean",
    "completions/clipped_ratio": "grpo_completion_clipped_ratio",
}

ROLLOUT, TRAIN, EVAL, SAVE, SAFE_MODE, DONE = (
    "ROLLOUT",
    "TRAIN",
    "EVAL",
    "SAVE",
    "SAFE_MODE",
    "DONE",
)
# Waiting for the rollout engine to answer again (dead, being replaced, compiling): not one of
# the hang detector's phases (detection.trainer.hang_phases), so a trainer whose engine is
# being healed is not taken for a hung one and restarted too.
WAIT_ENGINE = "WAIT_ENGINE"

DRILL_OOM_POINT = "its next optimizer step raises torch.OutOfMemoryError (RLGuard's TRL callback)"
DRILL_DISK_FULL_POINT = (
    "its next step end saves a checkpoint and the save fails with ENOSPC, "
    "'No space left on device' (RLGuard's TRL callback)"
)

ExceptHook = Callable[[type[BaseException], BaseException, TracebackType | None], Any]


# The callbacks of this process, for waiting_for_engine (the weight sync does not hold them).
_LIVE: weakref.WeakSet[RLGuardCallback] = weakref.WeakSet()


@contextmanager
def waiting_for_engine() -> Iterator[None]:
    """Report this process's trainer as ``WAIT_ENGINE`` for the block (the weight sync's wait
    for a dead engine, :mod:`integrations.trl.vllm_weights`); its phase before is put back
    after. Does nothing without a live callback, or outside a training step."""
    waiting = [cb for cb in list(_LIVE) if cb._enter_wait()]
    try:
        yield
    finally:
        for cb in waiting:
            cb._leave_wait()


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise IntegrationError(f"{name}={raw!r} is not an integer") from None


class RLGuardCallback(TrainerCallback):
    """Reports a TRL trainer's phase, progress and faults to RLGuard, seals its checkpoints and
    holds it in SAFE_MODE when told to.

    ``run_dir``, ``role``, ``rank`` and ``job`` default to what ``rlguard launch`` puts in the
    environment (``RLGUARD_RUN_DIR``, ``RLGUARD_ROLE`` or ``trainer``, ``RANK`` or 0,
    ``RLGUARD_JOB``). ``heartbeat_interval`` bounds how often progress is written (seconds; the
    hang detector learns the step time from it, so it is shorter than the reporter's default);
    ``safe_mode_poll`` is how often a paused trainer re-reads the control file.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str] | None = None,
        *,
        role: str | None = None,
        rank: int | None = None,
        job: str | None = None,
        heartbeat_interval: float = 0.5,
        safe_mode_poll: float = 0.5,
    ) -> None:
        self._versions = check_versions()
        directory = run_dir if run_dir is not None else os.environ.get(ENV_RUN_DIR)
        if not directory:
            raise IntegrationError(
                f"RLGuardCallback needs a run directory: run the script under rlguard launch "
                f"(it sets {ENV_RUN_DIR}) or pass run_dir="
            )
        if not (isinstance(safe_mode_poll, int | float) and 0 < safe_mode_poll <= 60):
            raise IntegrationError(
                f"safe_mode_poll must be in (0, 60] seconds, got {safe_mode_poll!r}"
            )
        self._run_dir = Path(directory)
        role = role if role is not None else os.environ.get(ENV_ROLE) or "trainer"
        rank = rank if rank is not None else _env_int("RANK", 0)
        job = job if job is not None else os.environ.get(ENV_JOB) or None
        try:
            previous = read_heartbeat(heartbeat_path(self._run_dir, role, rank))
            self._reporter = HeartbeatReporter(
                self._run_dir, role, rank, job=job, interval=heartbeat_interval
            )
        except (RecoveryError, ValueError) as exc:
            raise IntegrationError(f"RLGuardCallback: {exc}") from exc
        self._carry_fault_counts(previous)
        self._role, self._rank = role, rank
        try:
            drill_points.declare(
                self._run_dir,
                role,
                rank,
                {"oom": DRILL_OOM_POINT, "disk-full": DRILL_DISK_FULL_POINT},
            )
        except OSError as exc:  # those drills are refused then, training is not affected
            log.warning("could not declare the drill injection points: %s", exc)
        self._safe_mode_poll = float(safe_mode_poll)
        self._lock = threading.Lock()
        self._phase = "INIT"
        self._step_in_progress: int | None = None
        self._saving_step: int | None = None
        self._saved_step: int | None = None
        self._resumed_step = 0
        self._pause_after_save = False
        self._control_warned = False
        self._model: Any = None
        self._previous_excepthook: ExceptHook | None = None
        self._before_wait: str | None = None
        self._reporter.update(phase="INIT", force=True)
        self._reporter.start_keepalive()
        _LIVE.add(self)

    # ---- what the heartbeat says -------------------------------------------------------------

    @property
    def reporter(self) -> HeartbeatReporter:
        """The heartbeat reporter of this rank (for the script's own fault reports)."""
        return self._reporter

    def _set_phase(self, phase: str, *, force: bool = False) -> None:
        with self._lock:
            self._phase = phase
        self._reporter.update(phase=phase, force=force)

    def _enter_wait(self) -> bool:
        with self._lock:
            if self._phase not in (TRAIN, ROLLOUT):
                return False
            self._before_wait, self._phase = self._phase, WAIT_ENGINE
        self._reporter.update(phase=WAIT_ENGINE, force=True)
        return True

    def _leave_wait(self) -> None:
        with self._lock:
            if self._phase != WAIT_ENGINE or self._before_wait is None:
                return
            self._phase, self._before_wait = self._before_wait, None
            phase = self._phase
        self._reporter.update(phase=phase, force=True)

    def _carry_fault_counts(self, previous: dict[str, Any] | None) -> None:
        """A restarted trainer keeps the counts of the process before it, so the policy engine
        sees "the same step failed again" across the restart."""
        self._reporter.carry_over(previous)

    # ---- Trainer hooks -----------------------------------------------------------------------

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if getattr(args, "save_total_limit", None) == 1:
            log.warning(
                "save_total_limit=1: the Trainer deletes the previous checkpoint before the new "
                "one is sealed, so a kill in between leaves nothing complete to resume from"
            )
        self._resumed_step = state.global_step
        self._saved_step = state.global_step if state.global_step > 0 else None
        self._wrap_generate(kwargs.get("model"), args)
        self._previous_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        self._reporter.update(step=state.global_step)
        self._set_phase(TRAIN, force=True)

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        # Normally on_step_end caught SAFE_MODE at this same boundary and saved first; here only
        # when nothing has been trained since the last checkpoint (a restart into SAFE_MODE).
        if state.global_step in (self._saved_step, self._resumed_step) and self._safe_mode():
            self._hold_in_safe_mode()
        self._step_in_progress = state.global_step + 1
        self._set_phase(TRAIN)

    def on_pre_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._fire_drill_oom()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._step_in_progress = None
        self._fire_drill_disk_full(state.global_step)
        # Not forced: a write costs ~0.3-2 ms, and the interval (0.5 s) bounds how late the
        # hang detector, which learns the pace from the step, sees a step advance.
        self._reporter.update(step=state.global_step)
        if self._safe_mode():
            # A callback cannot save by itself; the Trainer saves right after this hook when
            # asked, and on_save then holds the trainer.
            control.should_save = True
            self._pause_after_save = True
        if control.should_save:
            self._saving_step = state.global_step
        if control.should_evaluate:
            self._set_phase(EVAL)
        elif control.should_save:
            self._set_phase(SAVE)

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._set_phase(SAVE if control.should_save else TRAIN)

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        step = state.global_step
        if args.should_save:  # the process that wrote the checkpoint seals it
            checkpoint = Path(str(args.output_dir)) / f"checkpoint-{step}"
            try:
                seal_checkpoint(
                    checkpoint, global_step=step, inference_version=step, framework=self._versions
                )
            except (OSError, RecoveryError) as exc:
                log.error("checkpoint %s could not be sealed: %s", checkpoint, exc)
                self._reporter.record_checkpoint_error()
            else:
                # GRPO here generates with the weights of the step it trains: the rollouts'
                # weight version is the training step.
                self._reporter.record_checkpoint(step, step)
        self._saving_step = None
        self._saved_step = step
        if self._pause_after_save:
            self._pause_after_save = False
            self._hold_in_safe_mode()
        self._set_phase(TRAIN)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        signals = {}
        for key, name in GRPO_SIGNALS.items():
            value = (logs or {}).get(key)
            if (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(value)
            ):
                signals[name] = float(value)
        if signals:
            self._reporter.set_signals(signals)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._unwrap_generate()
        if sys.excepthook == self._excepthook and self._previous_excepthook is not None:
            sys.excepthook = self._previous_excepthook
        self._reporter.update(step=state.global_step)
        self._set_phase(DONE, force=True)
        self._reporter.close()

    # ---- SAFE_MODE ---------------------------------------------------------------------------

    def _safe_mode(self) -> bool:
        try:
            return read_control(self._run_dir).mode is ControlMode.SAFE_MODE
        except ControlError as exc:
            if not self._control_warned:
                self._control_warned = True
                log.warning("control file unreadable, carrying on: %s", exc)
            return False

    def _hold_in_safe_mode(self) -> None:
        """Report SAFE_MODE and wait (the keepalive thread keeps the heartbeat fresh) until the
        control file says run again. An unreadable control file keeps the trainer paused."""
        log.warning("SAFE_MODE: trainer paused until an approver releases the job")
        self._set_phase(SAFE_MODE, force=True)
        while True:
            try:
                if read_control(self._run_dir).mode is not ControlMode.SAFE_MODE:
                    break
            except ControlError as exc:
                log.warning("control file unreadable while paused, staying paused: %s", exc)
            time.sleep(self._safe_mode_poll)
        log.warning("released from SAFE_MODE: training goes on")
        self._set_phase(TRAIN, force=True)

    # ---- ROLLOUT: TRL's generation -----------------------------------------------------------

    def _wrap_generate(self, model: Any, args: TrainingArguments) -> None:
        if getattr(args, "use_vllm", False) or getattr(
            args, "use_transformers_continuous_batching", False
        ):
            log.warning(
                "generation runs outside the policy model: steps are reported as TRAIN only"
            )
            return
        original = getattr(model, "generate", None)
        if original is None or getattr(original, "_rlguard_wrapped", False):
            return
        config = getattr(model, "generation_config", None)
        pad_id = getattr(config, "pad_token_id", None)
        eos = getattr(config, "eos_token_id", None)
        ends = tuple(
            i for i in (eos if isinstance(eos, list | tuple) else [eos]) if isinstance(i, int)
        )

        @functools.wraps(original)
        def generate(*call_args: Any, **call_kwargs: Any) -> Any:
            with self._lock:
                before = self._phase
            in_training = before in (TRAIN, ROLLOUT)
            if in_training:
                self._set_phase(ROLLOUT)
            try:
                output = original(*call_args, **call_kwargs)
            finally:
                if in_training:
                    self._set_phase(before)
            prompt = call_kwargs.get("input_ids", call_args[0] if call_args else None)
            self._count_tokens(output, prompt, pad_id, ends)
            return output

        generate._rlguard_wrapped = True  # type: ignore[attr-defined]
        model.generate = generate
        self._model = model

    def _count_tokens(
        self, output: Any, prompt: Any, pad_id: int | None, ends: tuple[int, ...]
    ) -> None:
        """Count the tokens generated, the completions, and the empty ones among them (every
        generated token an end-of-sequence or padding; unknowable without either id)."""
        sequences = getattr(output, "sequences", output)
        shape = getattr(sequences, "shape", None)
        prompt_shape = getattr(prompt, "shape", None)
        if shape is None or prompt_shape is None or len(shape) != 2:
            return
        generated = sequences[:, prompt_shape[-1] :]
        count = int((generated != pad_id).sum()) if pad_id is not None else int(generated.numel())
        self._reporter.add_tokens(count)
        content = None  # per token: neither padding nor an end of sequence
        for token in (pad_id, *ends) if pad_id is not None else ends:
            differs = generated != token
            content = differs if content is None else content & differs
        rows = int(shape[0])
        if generated.shape[-1] == 0:
            empty = rows
        else:
            empty = 0 if content is None else rows - int(content.any(dim=1).sum())
        self._reporter.record_samples(rows)
        if empty:
            self._reporter.record_failed_samples(empty)

    def _unwrap_generate(self) -> None:
        model, self._model = self._model, None
        if model is not None and "generate" in vars(model):
            del model.generate  # the class's own method again

    # ---- faults ------------------------------------------------------------------------------

    def _fire_drill_oom(self) -> None:
        """Raise the CUDA-OOM error a drill asked for (once: the request is taken atomically).
        A stat per optimizer step when none is asked."""
        order = drill_points.take(self._run_dir, self._role, self._rank, "oom")
        if order is None:
            return
        import torch  # the Trainer has imported it already

        log.error(
            "rlguard drill %s: raising an out-of-memory error at step %s",
            order.get("drill"),
            self._step_in_progress,
        )
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB (injected by rlguard drill "
            f"{order.get('drill')}: not a real allocation failure)"
        )

    def _fire_drill_disk_full(self, step: int) -> None:
        """Fail this step's checkpoint save as a full disk would, when a drill asked for it:
        the save is due now (a drill does not wait for ``save_steps``) and fails before the
        Trainer writes anything of it, so the newest complete checkpoint stays the one before."""
        order = drill_points.take(self._run_dir, self._role, self._rank, "disk-full")
        if order is None:
            return
        self._saving_step = step  # the exception hook counts it as a checkpoint error
        self._set_phase(SAVE, force=True)
        log.error(
            "rlguard drill %s: failing the checkpoint save of step %s with ENOSPC",
            order.get("drill"),
            step,
        )
        raise OSError(
            errno.ENOSPC,
            "No space left on device (injected by rlguard drill "
            f"{order.get('drill')}: checkpoint-{step} was not written)",
        )

    def _excepthook(
        self, kind: type[BaseException], value: BaseException, tb: TracebackType | None
    ) -> None:
        """An exception that ends the script: count it as a failed step, or as a checkpoint
        that could not be written when it came from a save, before the process exits."""
        try:
            if not issubclass(kind, KeyboardInterrupt):
                if self._saving_step is not None:
                    self._reporter.record_checkpoint_error()
                elif self._step_in_progress is not None:
                    self._reporter.record_step_failure(self._step_in_progress)
        except (RecoveryError, OSError) as exc:
            log.error("could not record the failure in the heartbeat: %s", exc)
        finally:
            previous = self._previous_excepthook or sys.__excepthook__
            previous(kind, value, tb)
