"""The task on a language model (requests, reward, the trainer's logprobs against the engine's)
and the healing stages read back from a run's timeline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from integrations.vllm.tiny_model import save_tiny_model
from workload.engines.healing import describe, healing_stages
from workload.engines.lm_task import (
    Vocabulary,
    completion_logprobs,
    disagreement_by_engine,
    load_policy,
    requests_for,
    reward,
)
from workload.job import RunDir
from workload.task import TaskSpec

pytestmark = pytest.mark.timeout(120)
SPEC = TaskSpec(group_size=4, prompts_per_worker=2)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("lm") / "model")


def test_requests_are_the_same_for_a_step_and_worker_and_differ_otherwise(model_dir: Path) -> None:
    vocab = Vocabulary.of_model(model_dir)
    a = requests_for(SPEC, vocab, 1234, 3, 1)
    assert a == requests_for(SPEC, vocab, 1234, 3, 1)
    assert len(a) == 8 and len({r.seed for r in a}) == 8
    assert {r.seed for r in a}.isdisjoint(r.seed for r in requests_for(SPEC, vocab, 1234, 3, 0))
    assert all(0 <= r.seed < 2**63 for r in a)
    # The prompt is "<bos>T=" in the model's own tokens.
    assert a[0].prompt_ids == [vocab.bos, *(vocab.chars[c] for c in f"{a[0].target:02d}=")]


def test_reward_counts_digit_characters_only(model_dir: Path) -> None:
    vocab = Vocabulary.of_model(model_dir)
    tokens = [vocab.chars["9"], vocab.chars["="], vocab.chars["3"], vocab.bos]
    assert vocab.digits(tokens) == [9, 0, 3, 0]
    assert reward(12, vocab.digits(tokens), SPEC) == 1.0
    assert reward(0, [9, 9, 9, 9], SPEC) == 0.0


def test_the_disagreement_is_per_engine_and_zero_for_the_trainers_own_logprobs(
    model_dir: Path,
) -> None:
    policy = load_policy(model_dir)
    samples = [{"prompt_ids": [2, 5, 6, 14], "tokens": [7, 8, 9, 10], "engine": e} for e in (0, 1)]
    with torch.no_grad():
        own = completion_logprobs(policy, samples)
    samples[0]["engine_logprobs"] = own[0].tolist()
    samples[1]["engine_logprobs"] = (own[1] + 0.5).tolist()
    diff = disagreement_by_engine(samples, own)
    assert diff[0]["mean"] == pytest.approx(0.0, abs=1e-6)
    assert diff[1]["mean"] == pytest.approx(0.5) and diff[1]["tokens"] == 4


def test_healing_stages_read_back_in_order(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    t0 = 1000.0
    for ts, kind, fields in [
        (t0, "engine_quarantined", {"rank": 1, "why": "gone"}),
        (t0 + 2, "spawn", {"role": "rollout", "rank": 1, "child_pid": 77, "warm": True}),
        (t0 + 2.5, "engine_up", {"rank": 1}),
        (t0 + 3, "engine_refit", {"rank": 1, "served": 1000004}),
        (t0 + 3.1, "engine_readmitted", {"rank": 1, "version": 1000004, "incarnation": "77:80"}),
        (t0 + 9, "engine_refit", {"rank": 1, "served": 1000005}),  # the next step's refit
    ]:
        line = {"ts": ts, "kind": kind, "pid": 77 if kind == "engine_up" else 5, **fields}
        with run.events.open("a") as f:
            f.write(json.dumps(line) + "\n")
    stages = healing_stages(run, 1, 77, since=t0 + 2)
    assert stages == {
        "rank": 1,
        "quarantined_s": 0.0,
        "replaced_s": 2.0,
        "warm": True,
        "up_s": 2.5,
        "refit_s": 3.0,
        "refit_version": 1000004,
        "readmitted_s": 3.1,
        "readmitted_version": 1000004,
    }
    assert describe(stages) == (
        "rollout-1: quarantined 0.0 s, replaced 2.00 s warm, up 2.50 s, "
        "refit to v1000004 3.00 s, readmitted at v1000004 3.10 s"
    )
    assert healing_stages(run, 0, 77, since=t0)["readmitted_s"] is None
