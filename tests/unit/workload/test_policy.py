from __future__ import annotations

import torch

from workload.policy import (
    TaskSpec,
    derive_seed,
    grpo_loss,
    init_policy,
    params_digest,
    prompts_for,
    reward,
    sample_group,
)

SPEC = TaskSpec(length=3, group_size=4, prompts_per_worker=2, hidden=16)


def test_seeds_depend_on_every_part_of_the_path() -> None:
    base = derive_seed(1, 2, 3, 4)
    assert base == derive_seed(1, 2, 3, 4)
    assert (
        len(
            {
                base,
                derive_seed(2, 2, 3, 4),
                derive_seed(1, 3, 3, 4),
                derive_seed(1, 2, 4, 4),
                derive_seed(1, 2, 3, 5),
            }
        )
        == 5
    )
    assert 0 <= base < 2**63


def test_reward_is_one_exactly_on_target_and_falls_with_the_miss() -> None:
    assert reward(10, [3, 3, 4], SPEC) == 1.0
    assert reward(10, [3, 3, 3], SPEC) < 1.0
    assert reward(10, [0, 0, 0], SPEC) < reward(10, [3, 3, 3], SPEC)


def test_sampling_is_reproducible_and_differs_by_worker() -> None:
    policy = init_policy(SPEC, 7)
    a = sample_group(policy, SPEC, 7, step=3, worker=0, prompt_index=1, target=12)
    b = sample_group(init_policy(SPEC, 7), SPEC, 7, step=3, worker=0, prompt_index=1, target=12)
    c = sample_group(policy, SPEC, 7, step=3, worker=1, prompt_index=1, target=12)
    assert a == b
    assert [s["digits"] for s in a] != [s["digits"] for s in c]
    assert prompts_for(SPEC, 7, 3, 0) == prompts_for(SPEC, 7, 3, 0)


def test_grpo_step_is_bit_for_bit_reproducible_and_moves_the_policy() -> None:
    def one_step() -> str:
        torch.manual_seed(0)
        policy, ref = init_policy(SPEC, 7), init_policy(SPEC, 7)
        samples = []
        for i, t in enumerate(prompts_for(SPEC, 7, 0, 0)):
            samples += sample_group(policy, SPEC, 7, 0, 0, i, t)
        opt = torch.optim.Adam(policy.parameters(), lr=0.01)
        loss, stats = grpo_loss(policy, ref, samples, SPEC, kl_coef=0.05)
        assert stats["kl"] == 0.0  # policy == reference before the first update
        loss.backward()
        opt.step()
        return params_digest(policy)

    first = one_step()
    assert first == one_step()
    assert first != params_digest(init_policy(SPEC, 7))
