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

Every optimizer step that finishes is appended to ``<output_dir>/steps.jsonl`` (step, pid, time):
the tests and the benchmark read it to prove which steps were trained, and how often.
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
}


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
        max_position_embeddings=64,
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


def make_reward(fail_at_step: int | None = None) -> Callable[..., list[float]]:
    """The verifiable reward; with ``fail_at_step`` it raises inside that training step (a
    stand-in for an OOM or a crashing reward service, for the tests)."""

    def sum_reward(
        completions: list[str], answer: list[str], trainer_state: Any = None, **_: Any
    ) -> list[float]:
        """Share of the answer's characters in the right place, minus a little per extra one."""
        step = None if trainer_state is None else trainer_state.global_step + 1
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
    args = parser.parse_args(argv)
    for name in ("max_steps", "save_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    return args


def build_trainer(args: argparse.Namespace) -> GRPOTrainer:
    size = SIZES[args.size]
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    per_step = size.generations * size.prompts_per_step
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
        # At least half the budget: the model soon learns to stop at once, and a step whose cost
        # shrinks towards nothing would not be the steady job a benchmark needs.
        generation_kwargs={"min_new_tokens": size.completion_tokens // 2},
        learning_rate=1e-4,
        beta=0.04,  # a reference model, so TRL reports the KL
        temperature=1.0,
        seed=args.seed,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    callbacks: list[TrainerCallback] = [StepLog(output_dir / "steps.jsonl")]
    if args.min_step_seconds > 0:
        callbacks.insert(0, MinStepTime(args.min_step_seconds))
    if args.stall_in_save_at is not None:
        callbacks.append(StallInSave(args.stall_in_save_at, output_dir / "stalled-in-save.pid"))
    use_rlguard = args.rlguard == "on" or (
        args.rlguard == "auto" and bool(os.environ.get("RLGUARD_RUN_DIR"))
    )
    if use_rlguard:
        from integrations.trl import RLGuardCallback

        callbacks.append(RLGuardCallback())
    return GRPOTrainer(
        model=str(initial_model_dir(output_dir, size, tokenizer, args.seed)),
        reward_funcs=make_reward(args.fail_at_step),
        args=config,
        train_dataset=build_dataset(max(64, args.max_steps * size.prompts_per_step * 2), args.seed),
        processing_class=tokenizer,
        callbacks=callbacks,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    trainer = build_trainer(args)
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
