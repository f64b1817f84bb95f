"""The reference job's task on a real language model, for rollouts served by inference engines.

The task is the digit-sum task of :mod:`workload.policy`, written as text: the prompt is
``<bos>T=`` (the target sum ``T`` in two digits), the engine samples ``length`` characters, and
the reward is verifiable: the digit characters of the completion count their value, any other
character counts 0, and ``1 - |sum - T| / max_sum`` is 1.0 exactly when they hit the target.
The policy is the job's Hugging Face causal LM (``integrations.vllm.tiny_model`` builds one),
the same weights the engines serve.

Everything random is seeded from (run seed, step, worker, sample) as in :mod:`workload.policy`:
the engines sample each request with its own seed, so a request retried on another engine that
holds the same weights gives the same tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from workload.policy import derive_seed, prompts_for
from workload.task import TaskSpec


@dataclass(frozen=True)
class Vocabulary:
    """The token ids the task needs from the model's tokenizer."""

    bos: int
    digit_ids: dict[int, int]  # token id -> its digit value
    chars: dict[str, int]  # character -> token id (for prompts)

    @staticmethod
    def of_model(model_dir: str | Path) -> Vocabulary:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(model_dir))
        chars: dict[str, int] = {}
        for c in "0123456789=":
            found = tok.convert_tokens_to_ids(c)
            if not isinstance(found, int) or found == tok.unk_token_id:
                raise ValueError(f"the tokenizer of {model_dir} has no token for {c!r}")
            chars[c] = found
        if tok.bos_token_id is None:
            raise ValueError(f"the tokenizer of {model_dir} has no bos token")
        return Vocabulary(
            bos=int(tok.bos_token_id),
            digit_ids={chars[str(d)]: d for d in range(10)},
            chars=chars,
        )

    def prompt(self, target: int) -> list[int]:
        return [self.bos, *(self.chars[c] for c in f"{target:02d}=")]

    def digits(self, token_ids: Sequence[int]) -> list[int]:
        return [self.digit_ids.get(int(t), 0) for t in token_ids]


def reward(target: int, digits: Sequence[int], spec: TaskSpec) -> float:
    return 1.0 - abs(sum(digits) - target) / spec.max_sum


@dataclass(frozen=True)
class Request:
    """One completion the job asks an engine for: the sample it becomes in a batch."""

    request_id: str
    step: int
    worker: int
    prompt_index: int
    sample: int
    target: int
    prompt_ids: list[int]
    seed: int

    def to_json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "step": self.step,
            "worker": self.worker,
            "prompt": self.prompt_index,
            "sample": self.sample,
            "target": self.target,
            "prompt_ids": self.prompt_ids,
            "seed": self.seed,
        }


def requests_for(
    spec: TaskSpec, vocab: Vocabulary, run_seed: int, step: int, worker: int
) -> list[Request]:
    """The requests whose samples make worker ``worker``'s batch of ``step``, in batch order.
    The prompts are those of :func:`workload.policy.prompts_for` (same seeds)."""
    out = []
    for i, target in enumerate(prompts_for(spec, run_seed, step, worker)):
        for g in range(spec.group_size):
            sample_no = i * spec.group_size + g
            out.append(
                Request(
                    request_id=f"s{step:06d}-w{worker:02d}-n{sample_no:04d}",
                    step=step,
                    worker=worker,
                    prompt_index=i,
                    sample=sample_no,
                    target=target,
                    prompt_ids=vocab.prompt(target),
                    # vLLM keeps per-request seeds in a signed 64-bit int: 63 bits fit.
                    seed=derive_seed(run_seed, step, worker, sample_no),
                )
            )
    return out


def sample_of(
    req: Request,
    vocab: Vocabulary,
    spec: TaskSpec,
    token_ids: list[int],
    engine_logprobs: list[float],
    *,
    engine: int,
    weight_version: int,
) -> dict[str, Any]:
    """The batch sample of a finished request. ``engine`` and ``engine_logprobs`` say who
    generated it; the trainer's update reads only the prompt, the tokens and the reward."""
    digits = vocab.digits(token_ids)
    return {
        **req.to_json(),
        "tokens": token_ids,
        "digits": digits,
        "reward": reward(req.target, digits, spec),
        "engine": engine,
        "engine_logprobs": engine_logprobs,
        "weight_version": weight_version,
    }


def load_policy(model_dir: str | Path) -> nn.Module:
    """The job's policy from its model directory, in float32 (what the engines serve)."""
    from transformers import AutoModelForCausalLM

    model: nn.Module = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.train()
    return model


def completion_logprobs(model: nn.Module, samples: Sequence[dict[str, Any]]) -> torch.Tensor:
    """Per-token log-probabilities (N × length) of each sample's completion under ``model``:
    the full-vocabulary log-softmax of the logits, as vLLM's ``raw_logprobs`` reports them."""
    prompts = torch.tensor([s["prompt_ids"] for s in samples])
    tokens = torch.tensor([s["tokens"] for s in samples])
    ids = torch.cat([prompts, tokens], dim=1)
    logits = model(input_ids=ids).logits[:, prompts.shape[1] - 1 : -1, :]
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(2, tokens.unsqueeze(2)).squeeze(2)


def lm_grpo_loss(
    policy: nn.Module,
    reference: nn.Module,
    samples: Sequence[dict[str, Any]],
    spec: TaskSpec,
    *,
    kl_coef: float,
) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
    """GRPO loss over ``samples`` in the order given (the order is part of determinism), its
    statistics, and the trainer's own per-token log-probabilities (detached) of the sampled
    tokens, to compare with what the engines reported."""
    rewards = torch.tensor([s["reward"] for s in samples], dtype=torch.float32)
    groups = rewards.view(-1, spec.group_size)
    adv = (groups - groups.mean(dim=1, keepdim=True)) / (groups.std(dim=1, keepdim=True) + 1e-4)
    adv = adv.reshape(-1)
    logp = completion_logprobs(policy, samples)
    with torch.no_grad():
        ref_logp = completion_logprobs(reference, samples)
    pg = -(adv.unsqueeze(1) * logp).sum(dim=1).mean()
    log_ratio = ref_logp - logp
    kl = (torch.exp(log_ratio) - log_ratio - 1).sum(dim=1).mean()
    loss = pg + kl_coef * kl
    stats = {
        "loss": float(loss.detach()),
        "kl": float(kl.detach()),
        "reward_mean": float(rewards.mean()),
        "hit_rate": float((rewards == 1.0).float().mean()),
    }
    return loss, stats, logp.detach()


def disagreement_by_engine(
    samples: Sequence[dict[str, Any]], trainer_logp: torch.Tensor
) -> dict[int, dict[str, float]]:
    """Per engine, the mean and max of |trainer logprob - engine logprob| over the tokens it
    sampled this step (the train/inference disagreement)."""
    engine_logp = torch.tensor([s["engine_logprobs"] for s in samples], dtype=torch.float32)
    diff = (trainer_logp.float() - engine_logp).abs()
    out: dict[int, dict[str, float]] = {}
    for engine in sorted({int(s["engine"]) for s in samples}):
        rows = torch.tensor([int(s["engine"]) == engine for s in samples])
        d = diff[rows]
        out[engine] = {
            "mean": float(d.mean()),
            "max": float(d.max()),
            "tokens": float(d.numel()),
        }
    return out
