"""The reference job's model and math: a tiny digit-sum task solved with GRPO.

Task: a prompt is a target sum ``T``; the policy writes ``length`` digits one at a time; the
reward is verifiable (``1 - |sum - T| / max_sum``, 1.0 exactly when the digits hit the target).
For each prompt a group of ``group_size`` samples is drawn, advantages are the rewards relative
to the group (mean subtracted, divided by the group's standard deviation), and the update is a
policy gradient with a KL penalty (k3 estimator) against the frozen initial policy.

Everything random takes an explicit :class:`torch.Generator` seeded from (run seed, step, worker,
sample), so a sample regenerated after a crash is the same sample, bit for bit.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from workload.task import DIGITS, TaskSpec


def derive_seed(run_seed: int, *parts: int | str) -> int:
    """A 63-bit seed from the run seed and a path such as (step, worker, sample)."""
    h = hashlib.sha256(struct.pack(">q", run_seed))
    for part in parts:
        h.update(b"/" + str(part).encode())
    return int.from_bytes(h.digest()[:8], "big") >> 1


def generator(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


class DigitPolicy(nn.Module):
    """Next-digit distribution from (target, position, running sum)."""

    def __init__(self, spec: TaskSpec) -> None:
        super().__init__()
        self.spec = spec
        n_sums = spec.max_sum + 1
        self.target = nn.Embedding(n_sums, spec.hidden)
        self.position = nn.Embedding(spec.length, spec.hidden)
        self.running = nn.Embedding(n_sums, spec.hidden)
        self.mlp = nn.Sequential(
            nn.Linear(spec.hidden, spec.hidden), nn.Tanh(), nn.Linear(spec.hidden, DIGITS)
        )

    def forward(self, targets: torch.Tensor, pos: int, running: torch.Tensor) -> torch.Tensor:
        p = torch.full_like(targets, pos)
        h = self.target(targets) + self.position(p) + self.running(running)
        logits: torch.Tensor = self.mlp(h)
        return logits

    def sequence_logprobs(self, targets: torch.Tensor, digits: torch.Tensor) -> torch.Tensor:
        """Per-token log-probabilities of ``digits`` (N × length) given ``targets`` (N)."""
        running = torch.zeros_like(targets)
        out = []
        for pos in range(self.spec.length):
            logp = torch.log_softmax(self(targets, pos, running), dim=-1)
            out.append(logp.gather(1, digits[:, pos : pos + 1]).squeeze(1))
            running = torch.clamp(running + digits[:, pos], max=self.spec.max_sum)
        return torch.stack(out, dim=1)


def init_policy(spec: TaskSpec, run_seed: int) -> DigitPolicy:
    """The step-0 policy, identical in every process for one run seed."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(run_seed, "init"))
        return DigitPolicy(spec)


def reward(target: int, digits: Sequence[int], spec: TaskSpec) -> float:
    """Verifiable reward: 1.0 when the digits sum to ``target``, less the further they miss."""
    return 1.0 - abs(sum(digits) - target) / spec.max_sum


def prompts_for(spec: TaskSpec, run_seed: int, step: int, worker: int) -> list[int]:
    g = generator(derive_seed(run_seed, step, worker, "prompts"))
    return torch.randint(0, spec.max_sum + 1, (spec.prompts_per_worker,), generator=g).tolist()


@torch.no_grad()
def sample_group(
    policy: DigitPolicy,
    spec: TaskSpec,
    run_seed: int,
    step: int,
    worker: int,
    prompt_index: int,
    target: int,
) -> list[dict[str, Any]]:
    """``group_size`` samples for one prompt; each sample draws from its own seeded generator."""
    samples = []
    for g_idx in range(spec.group_size):
        sample_no = prompt_index * spec.group_size + g_idx
        gen = generator(derive_seed(run_seed, step, worker, sample_no))
        t = torch.tensor([target])
        running = torch.zeros(1, dtype=torch.long)
        digits: list[int] = []
        for pos in range(spec.length):
            probs = torch.softmax(policy(t, pos, running), dim=-1)
            d = int(torch.multinomial(probs, 1, generator=gen).item())
            digits.append(d)
            running = torch.clamp(running + d, max=spec.max_sum)
        samples.append(
            {
                "prompt": prompt_index,
                "sample": sample_no,
                "target": target,
                "digits": digits,
                "reward": reward(target, digits, spec),
            }
        )
    return samples


def grpo_loss(
    policy: DigitPolicy,
    reference: DigitPolicy,
    samples: Sequence[dict[str, Any]],
    spec: TaskSpec,
    *,
    kl_coef: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO loss over ``samples`` in the order given (the order is part of determinism)."""
    targets = torch.tensor([s["target"] for s in samples])
    digits = torch.tensor([s["digits"] for s in samples])
    rewards = torch.tensor([s["reward"] for s in samples], dtype=torch.float32)
    groups = rewards.view(-1, spec.group_size)
    adv = (groups - groups.mean(dim=1, keepdim=True)) / (groups.std(dim=1, keepdim=True) + 1e-4)
    adv = adv.reshape(-1)
    logp = policy.sequence_logprobs(targets, digits)
    with torch.no_grad():
        ref_logp = reference.sequence_logprobs(targets, digits)
    pg = -(adv.unsqueeze(1) * logp).sum(dim=1).mean()
    log_ratio = ref_logp - logp
    kl = (torch.exp(log_ratio) - log_ratio - 1).sum(dim=1).mean()
    loss = pg + kl_coef * kl
    return loss, {
        "loss": float(loss.detach()),
        "kl": float(kl.detach()),
        "reward_mean": float(rewards.mean()),
        "hit_rate": float((rewards == 1.0).float().mean()),
    }


def params_digest(policy: nn.Module) -> str:
    """SHA-256 over every parameter's raw bytes, in name order: equal iff bit-for-bit equal."""
    h = hashlib.sha256()
    for name, tensor in sorted(policy.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().contiguous().numpy().tobytes())
    return h.hexdigest()
