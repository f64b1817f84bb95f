"""A complete GRPO run with TRL's ``GRPOTrainer`` on this machine, under RLGuard.

The task is verifiable: the prompt is a sum of two digits (``"3+4="``) and the reward is the share
of the answer's characters the completion gets right (1.0 for exactly ``"7"``), so no reward model
and nothing from a hub is needed. The policy is a small Qwen2 causal LM built from a config with
random weights, and the tokenizer a character-level one built here with ``tokenizers``.

Sizes (``--size``, see ``SIZES``): ``full`` (default) is sized like the reference job, 1-3 s per
step on 2 CPU cores (measured 1.2-2.2 s on a loaded machine): a 4-layer, 512-wide model (about
13 M parameters), 6 prompts x 8 generations of 24 to 48 tokens per step. A 2-layer, 64-wide model
trains at ~40 ms per step, which would make any restart look expensive. ``tiny`` is for tests:
a 2-layer, 32-wide model, 2 prompts x 4 generations of 4 to 8 tokens, a few tens of ms per step.

Run it under RLGuard::

    rlguard launch --job my-grpo --role trainer --run-dir /tmp/runs/my-grpo --integration trl -- \\
        python examples/trl_grpo/train.py --output_dir /tmp/ckpt/my-grpo --max_steps 100

``rlguard launch`` sets ``RLGUARD_RUN_DIR``; when it is set (or ``--rlguard on``) the script adds
:class:`integrations.trl.RLGuardCallback` to the trainer, the one line a user adds to their own
script. ``--rlguard off`` runs the same job without it (the benchmark's overhead baseline).

With RLGuard on, every optimizer step is also snapshotted into the launcher's shared memory
(:func:`integrations.trl.snapshots.enable_snapshots`, the second line a user adds; ``--snapshots
off`` leaves it out), and a restart resumes from the newest committed snapshot.

Every optimizer step that finishes is appended to ``<output_dir>/steps.jsonl`` (step, pid, time):
the tests and the benchmark read it to prove which steps were trained, and how often.
With snapshots on, every generation batch is also logged in RLGuard's write-ahead log
(:func:`integrations.trl.generation_log.enable_generation_log`; ``--generation_log off`` leaves
it out): a restart between a generation and the commit of its step reuses the batch.

``--kill_at MOMENT:STEP`` (tests) SIGKILLs the process at a named moment of a step, once per
output directory: ``generation`` (the step's completions generated, being scored), ``backward``
(inside the backward pass), ``snapshot_copy`` (the step's snapshot copied, not yet committed),
``generation_logged`` (the step's generation batch durable in the log, not yet used),
``snapshot_saved`` (the step's snapshot committed in this rank's memory, before the round that
commits the step on every rank). With several ranks (``rlguard launch --nproc N``)
``--kill_rank R`` makes only rank R fire.

Generation on a real vLLM engine (``--vllm_server URL``): TRL's ``vllm_mode="server"``, with
RLGuard's weight path as TRL's weight sync (:mod:`integrations.trl.vllm_weights`; TRL's own is
NCCL only). The engine serves the example's initial model with RLGuard's worker extension::

    MODEL=$(python examples/trl_grpo/train.py --output_dir /tmp/ckpt/g --size engine --write_initial_model)
    VLLM_SERVER_DEV_MODE=1 VLLM_CPU_KVCACHE_SPACE=1 python -m vllm.entrypoints.openai.api_server \\
        --model $MODEL --port 8000 --max-model-len 64 --enforce-eager --dtype float32 \\
        --logprobs-mode processed_logprobs \\
        --worker-extension-cls integrations.vllm.worker_extension.RLGuardWeightLoader &
    python examples/trl_grpo/train.py --output_dir /tmp/ckpt/g --size engine \\
        --vllm_server http://127.0.0.1:8000 --max_steps 20

For RLGuard to heal the engine, run it as the job's rollout role (``rlguard launch --role
rollout -- python -m integrations.vllm.host --model $MODEL --port 8000 ...``) and give the
trainer ``--vllm_engine_wait``: docs/integrations.md, "RLGuard heals the engine".
"""

from __future__ import annotations

import os

# Nothing may reach a hub: TRL and huggingface_hub otherwise phone home from background threads.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from transformers import (  # noqa: E402
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    TrainerCallback,
)
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

ALPHABET = "0123456789+="
PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"


@dataclass(frozen=True)
class Size:
    """How big one step is: the model and how much it generates per step."""

    hidden: int
    layers: int
    heads: int
    generations: int  # completions per prompt (GRPO's group)
    prompts_per_step: int
    completion_tokens: int


SIZES = {
    # 1-3 s per step on 2 CPU cores: 48 completions of 24-48 tokens from a 4-layer model.
    "full": Size(
        hidden=512, layers=4, heads=8, generations=8, prompts_per_step=6, completion_tokens=48
    ),
    # For tests: a few tens of milliseconds per step.
    "tiny": Size(
        hidden=32, layers=2, heads=2, generations=4, prompts_per_step=2, completion_tokens=8
    ),
    # tiny, with a head size vLLM's CPU attention supports (32; tiny's 16 is not): for
    # --vllm_server on this machine.
    "engine": Size(
        hidden=64, layers=2, heads=2, generations=4, prompts_per_step=2, completion_tokens=8
    ),
}
# The positions the model has; a vLLM server for it needs --max-model-len at most this.
MAX_POSITIONS = 64


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer for digits, '+' and '=' (built here, nothing downloaded)."""
    vocab = {tok: i for i, tok in enumerate([PAD, EOS, BOS, UNK, *ALPHABET])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, eos_token=EOS, bos_token=BOS, unk_token=UNK
    )


def build_model(size: Size, tokenizer: PreTrainedTokenizerFast, seed: int) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 model of ``size`` (seeded: every run starts from the same one)."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=size.hidden,
        intermediate_size=size.hidden * 2,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.heads,
        max_position_embeddings=MAX_POSITIONS,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config)


def initial_model_dir(
    output_dir: Path, size: Size, tokenizer: PreTrainedTokenizerFast, seed: int
) -> Path:
    """The starting weights saved under ``output_dir`` (written once, by rename, so a kill leaves
    none or all of it). TRL loads its reference model (for the KL term) from this same path."""
    final = output_dir / f"initial-model-{seed}"
    if not (final / "config.json").exists():
        tmp = output_dir / f".initial-model-{seed}-{os.getpid()}"
        build_model(size, tokenizer, seed).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, final)
    return final


def build_dataset(count: int, seed: int) -> Dataset:
    """``count`` prompts ``"a+b="`` with their answers (a column the reward function receives)."""
    rng = random.Random(seed)
    pairs = [(rng.randrange(10), rng.randrange(10)) for _ in range(count)]
    return Dataset.from_dict(
        {"prompt": [f"{a}+{b}=" for a, b in pairs], "answer": [str(a + b) for a, b in pairs]}
    )


KILL_MOMENTS = ("generation", "backward", "snapshot_copy", "snapshot_saved", "generation_logged")


class KillSwitch:
    """``--kill_at MOMENT:STEP``: SIGKILL this process at ``MOMENT`` of step ``STEP``, once per
    output directory (a file records that it fired, so the restarted run gets through). A
    deterministic stand-in for a machine fault, for the tests and the benchmark."""

    def __init__(self, spec: str | None, output_dir: Path, rank: int | None = None) -> None:
        self.moment: str | None = None
        self.step = -1
        # --kill_rank: only that rank of several fires (the others run on until they notice).
        if rank is not None and rank != int(os.environ.get("RANK", "0") or 0):
            spec = None
        if spec:
            moment, _, step = spec.partition(":")
            self.moment, self.step = moment, int(step)
        self._fired = output_dir / f"killed-at-{spec}".replace(":", "-")

    def __call__(self, moment: str, step: int) -> None:
        if moment == self.moment and step == self.step and not self._fired.exists():
            self._fired.write_text(str(os.getpid()), encoding="utf-8")
            os.kill(os.getpid(), signal.SIGKILL)


class KillInBackward(TrainerCallback):
    """Arms a gradient hook on one parameter for the kill step: it fires inside backward."""

    def __init__(self, kill: KillSwitch) -> None:
        self._kill = kill

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = state.global_step + 1
        if step == self._kill.step and kwargs.get("model") is not None:
            param = next(p for p in kwargs["model"].parameters() if p.requires_grad)

            def in_backward(grad: torch.Tensor) -> torch.Tensor:
                self._kill("backward", step)
                return grad

            param.register_hook(in_backward)


def make_reward(
    fail_at_step: int | None = None, kill: KillSwitch | None = None
) -> Callable[..., list[float]]:
    """The verifiable reward; with ``fail_at_step`` it raises inside that training step (a
    stand-in for an OOM or a crashing reward service, for the tests); ``kill`` is offered the
    ``generation`` moment (the step's completions exist, the step has not used them)."""

    def sum_reward(
        completions: list[str], answer: list[str], trainer_state: Any = None, **_: Any
    ) -> list[float]:
        """Share of the answer's characters in the right place, minus a little per extra one."""
        step = None if trainer_state is None else trainer_state.global_step + 1
        if kill is not None and step is not None:
            kill("generation", step)
        if fail_at_step is not None and step == fail_at_step:
            raise RuntimeError(f"injected failure in training step {step}")
        rewards = []
        for completion, expected in zip(completions, answer, strict=True):
            right = sum(1 for got, want in zip(completion, expected, strict=False) if got == want)
            extra = max(0, len(completion) - len(expected))
            rewards.append(right / len(expected) - 0.05 * extra)
        return rewards

    return sum_reward


class StepLog(TrainerCallback):
    """Appends every finished optimizer step to ``steps.jsonl`` (what the tests check)."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        line = json.dumps({"step": state.global_step, "pid": os.getpid(), "t": time.time()})
        with open(self._path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")


class MinStepTime(TrainerCallback):
    """Pads every optimizer step to at least ``seconds`` (``--min_step_seconds``): the tiny size
    trains at a few tens of ms per step on an idle machine, too fast for a test to act mid-run,
    and 10-50 times slower on a busy one; a floor keeps a test's step count meaningful on both.
    A step slower than the floor is not touched."""

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._began = time.monotonic()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._began = time.monotonic()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        left = self._seconds - (time.monotonic() - self._began)
        if left > 0:
            time.sleep(left)


class StallInSave(TrainerCallback):
    """Holds the process after the Trainer wrote ``checkpoint-N`` and before RLGuard seals it:
    the window a kill during a save hits, made wide for the tests (``--stall_in_save_at``)."""

    def __init__(self, step: int, path: Path) -> None:
        self._step = step
        self._path = path

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Once per output dir: the restarted run saves this step again and must get through.
        if state.global_step == self._step and not self._path.exists():
            tmp = self._path.with_suffix(".tmp")
            tmp.write_text(str(os.getpid()), encoding="utf-8")
            os.replace(tmp, self._path)  # whole, for a test that reads it the moment it appears
            time.sleep(3600)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", required=True, help="where checkpoint-N directories go")
    parser.add_argument("--max_steps", type=int, default=100)
    parser.add_argument("--save_steps", type=int, default=10)
    parser.add_argument(
        "--resume_from_checkpoint",
        default=None,
        help="a checkpoint-N directory (rlguard launch passes the newest complete one)",
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rlguard",
        choices=("auto", "on", "off"),
        default="auto",
        help="add RLGuardCallback (auto: when run by rlguard launch, i.e. RLGUARD_RUN_DIR is set)",
    )
    parser.add_argument(
        "--min_step_seconds", type=float, default=0.0, help="pad each step to at least this long"
    )
    parser.add_argument(
        "--fail_at_step", type=int, default=None, help="test fault: the reward raises in this step"
    )
    parser.add_argument(
        "--stall_in_save_at",
        type=int,
        default=None,
        help="test fault: stall after writing checkpoint-N, before it is sealed",
    )
    parser.add_argument(
        "--snapshots",
        choices=("auto", "on", "off"),
        default="auto",
        help="every-step memory snapshots (auto: whenever RLGuard is on)",
    )
    parser.add_argument(
        "--snapshot_shm_limit",
        type=int,
        default=None,
        help="the most bytes the memory snapshots may take (default: what /dev/shm has free)",
    )
    parser.add_argument(
        "--generation_log",
        choices=("auto", "on", "off"),
        default="auto",
        help="log generation batches in RLGuard's WAL (auto: whenever snapshots are on)",
    )
    parser.add_argument(
        "--steps_per_generation",
        type=int,
        default=None,
        help="micro-steps one generation serves (TRL's default: gradient_accumulation_steps)",
    )
    parser.add_argument(
        "--kill_at", default=None, help=f"test fault: MOMENT:STEP, MOMENT one of {KILL_MOMENTS}"
    )
    parser.add_argument(
        "--kill_rank", type=int, default=None, help="test fault: only this rank fires --kill_at"
    )
    parser.add_argument(
        "--vllm_server",
        default=None,
        help="generate on this vLLM server (http://host:port) with RLGuard's weight sync",
    )
    parser.add_argument(
        "--vllm_transport",
        choices=("tcp", "shm"),
        default="tcp",
        help="how the engine pulls weights",
    )
    parser.add_argument(
        "--vllm_engine_wait",
        type=float,
        default=0.0,
        help="seconds to wait for a dead engine to come back (restarted at the same URL)",
    )
    parser.add_argument(
        "--write_initial_model",
        action="store_true",
        help="write the initial model under --output_dir, print its path and exit (for the engine)",
    )
    args = parser.parse_args(argv)
    if args.kill_at is not None:
        moment, _, step = args.kill_at.partition(":")
        if moment not in KILL_MOMENTS or not step.isdigit():
            parser.error(
                f"--kill_at must be MOMENT:STEP with MOMENT in {KILL_MOMENTS}, got {args.kill_at!r}"
            )
    for name in ("max_steps", "save_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    return args


def use_rlguard(args: argparse.Namespace) -> bool:
    """Whether RLGuard's callback is on: ``--rlguard on``, or auto under ``rlguard launch``."""
    return args.rlguard == "on" or (
        args.rlguard == "auto" and bool(os.environ.get("RLGUARD_RUN_DIR"))
    )


def vllm_config(args: argparse.Namespace) -> dict[str, Any]:
    """The GRPOConfig fields for ``--vllm_server`` (none without it). RLGuard's weight sync is
    installed here, before the trainer is built: TRL makes its client in the constructor."""
    if not args.vllm_server:
        return {}
    from integrations.trl.vllm_weights import use_rlguard_weight_sync

    use_rlguard_weight_sync(transport=args.vllm_transport, engine_wait=args.vllm_engine_wait)
    return {
        "use_vllm": True,
        "vllm_mode": "server",
        "vllm_server_base_url": args.vllm_server,
        "vllm_server_timeout": 60.0,
    }


def build_trainer(args: argparse.Namespace) -> GRPOTrainer:
    size = SIZES[args.size]
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    per_step = size.generations * size.prompts_per_step
    # At least half the budget: the model soon learns to stop at once, and a step whose cost
    # shrinks towards nothing would not be the steady job a benchmark needs. vLLM names the
    # floor min_tokens, transformers min_new_tokens.
    floor = "min_tokens" if args.vllm_server else "min_new_tokens"
    config = GRPOConfig(
        output_dir=str(output_dir),
        max_steps=args.max_steps,
        save_strategy="steps",
        save_steps=args.save_steps,
        save_total_limit=3,  # >= 2: see docs/integrations.md (a kill between rotation and marker)
        logging_steps=1,
        per_device_train_batch_size=per_step,
        num_generations=size.generations,
        max_completion_length=size.completion_tokens,
        generation_kwargs={floor: size.completion_tokens // 2},
        learning_rate=1e-4,
        beta=0.04,  # a reference model, so TRL reports the KL
        temperature=1.0,
        seed=args.seed,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        steps_per_generation=args.steps_per_generation,
        **vllm_config(args),
    )
    callbacks: list[TrainerCallback] = [StepLog(output_dir / "steps.jsonl")]
    if args.min_step_seconds > 0:
        callbacks.insert(0, MinStepTime(args.min_step_seconds))
    if args.stall_in_save_at is not None:
        callbacks.append(StallInSave(args.stall_in_save_at, output_dir / "stalled-in-save.pid"))
    kill = KillSwitch(args.kill_at, output_dir, args.kill_rank)
    if kill.moment == "backward":
        callbacks.append(KillInBackward(kill))
    if use_rlguard(args):
        from integrations.trl import RLGuardCallback

        callbacks.append(RLGuardCallback())
    # With several ranks (rlguard launch --nproc N) the first writes the initial model and the
    # others wait for it: two writers raced on the rename and one read a half-written config.
    from accelerate import PartialState

    with PartialState().main_process_first():
        model_dir = initial_model_dir(output_dir, size, tokenizer, args.seed)
    return GRPOTrainer(
        model=str(model_dir),
        reward_funcs=make_reward(args.fail_at_step, kill),
        args=config,
        train_dataset=build_dataset(max(64, args.max_steps * size.prompts_per_step * 2), args.seed),
        processing_class=tokenizer,
        callbacks=callbacks,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    if args.write_initial_model:
        output_dir = Path(args.output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        model = initial_model_dir(output_dir, SIZES[args.size], build_tokenizer(), args.seed)
        sys.stdout.write(f"{model}\n")
        return 0
    trainer = build_trainer(args)
    snapshots = args.snapshots == "on" or (args.snapshots == "auto" and use_rlguard(args))
    kill = KillSwitch(args.kill_at, Path(args.output_dir), args.kill_rank)
    if args.generation_log == "on" or (args.generation_log == "auto" and snapshots):
        from integrations.trl.generation_log import enable_generation_log

        enable_generation_log(trainer, after_log=lambda step, _i: kill("generation_logged", step))
    if snapshots:
        from integrations.trl.snapshots import enable_snapshots

        enable_snapshots(
            trainer,
            resume_from_checkpoint=args.resume_from_checkpoint,
            shm_limit_bytes=args.snapshot_shm_limit,
            after_copy=lambda step: kill("snapshot_copy", step),
            after_snapshot=lambda step: kill("snapshot_saved", step),
        )
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
