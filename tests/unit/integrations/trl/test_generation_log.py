"""integrations/trl/generation_log.py without a trainer run: what a generation changes besides
its output (metrics appended or replaced, RNG states) replayed exactly, the digest of its prompts,
and the errors that name an unsupported version, trainer or missing run directory."""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch

from integrations import IntegrationError
from integrations.trl import generation_log
from integrations.trl.generation_log import (
    apply_metric_changes,
    enable_generation_log,
    inputs_digest,
    metric_changes,
    same_rng_states,
    set_rng_states,
)
from integrations.trl.snapshots import rng_states

pytestmark = pytest.mark.timeout(60)


def test_metric_changes_replay_appends_and_replacements() -> None:
    # As GRPOTrainer._generate_and_score_completions does: num_tokens is replaced, the rest
    # appended to what the step's earlier micro-batches left there.
    before: dict[str, list[Any]] = defaultdict(list, {"reward": [0.5], "num_tokens": [100]})
    after = defaultdict(list, {k: list(v) for k, v in before.items()})
    after["reward"].append(0.75)
    after["num_tokens"] = [180]
    after["completions/mean_length"].append(8.0)
    changes = metric_changes(before, after)
    assert changes == [
        ("reward", "extend", [0.75]),
        ("num_tokens", "set", [180]),
        ("completions/mean_length", "set", [8.0]),
    ]
    replayed: dict[str, list[Any]] = defaultdict(list, {"reward": [0.5], "num_tokens": [100]})
    apply_metric_changes(replayed, changes)
    assert replayed == after


def test_rng_states_are_compared_and_put_back_exactly() -> None:
    before = rng_states(False)
    assert same_rng_states(before, rng_states(False))
    random.random(), np.random.rand(), torch.rand(3)  # what a generation draws
    after = rng_states(False)
    assert not same_rng_states(before, after)
    drawn = (random.random(), float(np.random.rand()), torch.rand(3))
    set_rng_states(after)
    again = (random.random(), float(np.random.rand()), torch.rand(3))
    assert drawn[:2] == again[:2] and torch.equal(drawn[2], again[2])
    set_rng_states(before)
    assert same_rng_states(before, rng_states(False))
    torch.rand(1)  # only torch moved: still told apart
    assert not same_rng_states(before, rng_states(False))


def test_inputs_digest_follows_the_prompts_and_tensor_values() -> None:
    rows = [{"prompt": "3+4=", "answer": "7"}, {"prompt": "1+1=", "answer": "2"}]
    assert inputs_digest(rows) == inputs_digest([dict(r) for r in rows])
    assert inputs_digest(rows) != inputs_digest(rows[::-1])
    with_tensor = [{"prompt": "3+4=", "ids": torch.tensor([1, 2])}]
    assert inputs_digest(with_tensor) == inputs_digest(
        [{"prompt": "3+4=", "ids": torch.tensor([1, 2])}]
    )
    assert inputs_digest(with_tensor) != inputs_digest(
        [{"prompt": "3+4=", "ids": torch.tensor([1, 3])}]
    )


def test_an_unsupported_trl_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(generation_log, "GENERATION_LOG_TRL", ("9.0.0", "9.1"))
    with pytest.raises(IntegrationError, match=r"trl 1\.16\.\d+ .*trl>=9\.0\.0,<9\.1"):
        enable_generation_log(cast(Any, object()), run_dir="/nonexistent")


def test_an_unsupported_transformers_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(generation_log, "GENERATION_LOG_TRANSFORMERS", ("4.0.0", "4.1"))
    with pytest.raises(IntegrationError, match=r"transformers>=4\.0\.0,<4\.1"):
        generation_log.check_generation_log_versions()


def test_a_trainer_that_is_not_grpo_is_refused(tmp_path: Path) -> None:
    with pytest.raises(IntegrationError, match="needs TRL's GRPOTrainer, got object"):
        enable_generation_log(cast(Any, object()), run_dir=tmp_path)
