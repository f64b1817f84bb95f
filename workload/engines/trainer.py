"""The trainer of the reference job when its rollouts come from vLLM engines
(``python -m workload.engines.trainer --run-dir D``; ``workload.launch --rollout-engine vllm``).

It is :class:`workload.trainer.Trainer` (checkpoints, phase machine, snapshots, publication
through :mod:`recovery.transfer`) with three differences:

* the policy is the job's Hugging Face causal LM (``model_dir``), the model the engines serve,
  and the loss is :func:`workload.engines.lm_task.lm_grpo_loss`;
* it is the job's single controller, as verl's driver is: after publishing a step's weights it
  has every engine refit to them (:class:`workload.engines.fleet.EngineFleet`) and then
  generates the step's batches itself, through its router, one ``/v1/completions`` per sample
  (:class:`workload.engines.rollouts.EngineRollouts`). A trainer restarted after a crash reuses
  the committed batches and the finished requests of the WAL;
* after each update it compares its own log-probabilities of the sampled tokens with those
  the engine reported, per engine (:func:`workload.engines.lm_task.disagreement_by_engine`).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import torch

from integrations.vllm.worker_extension import specs_of
from recovery.batch import CommittedBatch
from recovery.wal import WriteAheadLog
from workload.engines.fleet import EngineFleet
from workload.engines.lm_task import (
    Vocabulary,
    disagreement_by_engine,
    lm_grpo_loss,
    load_policy,
)
from workload.engines.rollouts import EngineRollouts
from workload.job import WEIGHT_SET, RunDir, read_json
from workload.trainer import Trainer, run_trainer

log = logging.getLogger("rlguard.workload.engines")
REFIT_TIMEOUT_S = 60.0
# --wait-engines: how long the first step waits for every engine (a cold start is 20-60 s here).
ALL_ENGINES_TIMEOUT_S = 300.0


class EngineTrainer(Trainer):
    def __init__(self, run: RunDir, incarnation: int) -> None:
        super().__init__(run, incarnation)
        assert self.cfg.model_dir is not None  # JobConfig refuses vllm without it
        self.vocab = Vocabulary.of_model(self.cfg.model_dir)
        self._registry = str((read_json(run.runtime) or {})["registry"])
        self._specs: list[list[Any]] = []
        self._waited_for_all = False
        self._disagreement: dict[int, dict[str, float]] = {}
        self.fleet = EngineFleet(
            run,
            self.cfg.rollouts,
            refit_source=self._refit_source,
            refit_timeout=REFIT_TIMEOUT_S,
            probation_s=self.cfg.engine_probation_s,
            request_timeout=self.cfg.engine_request_timeout_s,
        )
        self.fleet.start()
        self.wal = WriteAheadLog(run.wal, lock_timeout=30.0)
        self.rollouts = EngineRollouts(
            run,
            self.cfg,
            self.vocab,
            self.fleet,
            self.wal,
            request_timeout=self.cfg.engine_request_timeout_s,
        )

    def _make_policies(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        assert self.cfg.model_dir is not None
        reference = load_policy(self.cfg.model_dir)
        reference.eval()
        for p in reference.parameters():
            p.requires_grad_(False)
        return load_policy(self.cfg.model_dir), reference

    def _loss(self, samples: list[dict[str, Any]]) -> tuple[torch.Tensor, dict[str, float]]:
        loss, stats, trainer_logp = lm_grpo_loss(
            self.policy, self.reference, samples, self.cfg.task, kl_coef=self.cfg.kl_coef
        )
        self._disagreement = disagreement_by_engine(samples, trainer_logp)
        worst = max((d["mean"] for d in self._disagreement.values()), default=0.0)
        return loss, {**stats, "logprob_diff_mean_worst": worst}

    def _train(self, batches: list[CommittedBatch]) -> dict[str, float]:
        stats = super()._train(batches)
        self.fleet.record_disagreement(self._disagreement, self.step)
        self.run.event(
            "logprob_disagreement",
            step=self.step,
            engines={str(k): v for k, v in self._disagreement.items()},
        )
        return stats

    def _published(self, version: int, tensors: dict[str, torch.Tensor]) -> None:
        self._specs = specs_of(tensors)
        self.fleet.set_target(version)

    def _refit_source(self, version: int) -> dict[str, Any]:
        return {
            "registry": self._registry,
            "weight_set": WEIGHT_SET,
            "transport": self.cfg.transport,
            "version": version,
            "specs": self._specs,
            "timeout": REFIT_TIMEOUT_S,
        }

    def _batches(self) -> list[CommittedBatch] | None:
        found = super()._batches()
        if found is not None:
            return found
        missing = [
            w
            for w in range(self.cfg.rollouts)
            if not (self.run.batches / self.run.batch_id(self.step, w) / "SUCCESS").exists()
        ]
        # The engines refit to this step's weights first; the router sends only to those that
        # serve them (and waits for one, should none be admitted).
        self.fleet.wait_refit(timeout=REFIT_TIMEOUT_S)
        if self.cfg.wait_all_engines and not self._waited_for_all:
            # Once, before the first batch: later an engine out is healed while the job goes on.
            self._waited_for_all = True
            if not self.fleet.wait_all_admitted(timeout=ALL_ENGINES_TIMEOUT_S):
                log.warning(
                    "not every engine was admitted in %s s; starting anyway", ALL_ENGINES_TIMEOUT_S
                )
        self.rollouts.generate_step(self.step, missing)
        return super()._batches()

    def close(self) -> None:
        try:
            self.rollouts.close()
            self.fleet.close()
            self.wal.close()
        finally:
            super().close()


def main(argv: list[str] | None = None) -> int:
    return run_trainer("python -m workload.engines.trainer", EngineTrainer, argv)


def warm_up() -> None:
    """What a standby trainer pays for ahead (torch, transformers): see workload.trainer."""
    import transformers  # noqa: F401 - imported for its cost, ahead of a takeover

    from workload.trainer import warm_up as torch_warm_up

    torch_warm_up()


if __name__ == "__main__":
    sys.exit(main())
