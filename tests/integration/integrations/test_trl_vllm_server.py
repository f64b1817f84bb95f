"""TRL's real ``GRPOTrainer`` generating on a real vLLM engine (``use_vllm=True,
vllm_mode="server"``) with RLGuard's weight path as TRL's weight sync
(:mod:`integrations.trl.vllm_weights`), through the example's ``--vllm_server`` option.

What is checked after every step: the step's completions came from the engine (its
``vllm:request_success_total`` rose during the step), every worker of the engine reports the
version the trainer published for the step (version == the step's index), and the engine's
log-probabilities of a fixed prompt equal the trainer's model's with the weights the step
generated with. Then the healing path: the engine's Worker is SIGKILLed between steps, a
replacement starts on the same port, and the trainer refits it to the current version before it
samples from it; training finishes. Last, the replacement's Worker is killed too and a third
engine started: TRL's next ``generate`` (no weight push before it) refits it first.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, TrainerCallback

from integrations.trl.vllm_weights import (
    EXTENSION_CLS,
    RLGuardWeightSync,
    WeightSyncError,
    remove_rlguard_weight_sync,
)
from integrations.vllm.server import EngineSettings, VLLMServer
from tests.harness import wait_for
from tests.harness.vllm_engines import start_engine, stop_engine

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(900),
    # TRL 1.16 warns that it was tested with vLLM up to 0.31 (this is 0.32); it and transformers
    # warn about their own deprecations while training.
    pytest.mark.filterwarnings(
        "ignore::FutureWarning", "ignore::UserWarning", "ignore::DeprecationWarning"
    ),
]

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "trl_grpo" / "train.py"
PROMPT = [2, 5, 14, 8, 15]  # <bos> "1+4=", ids of the example's tokenizer
# The test's learning rate: large enough that one step moves the engine's log-probabilities by
# far more than the tolerance, so serving the previous version cannot pass for the current one.
LEARNING_RATE = 3e-2
TOLERANCE = 2e-3


def _example() -> ModuleType:
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import train as example
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    module: ModuleType = example
    return module


def _settings(model_dir: Path) -> EngineSettings:
    return EngineSettings(
        max_model_len=_example().MAX_POSITIONS,
        worker_extension_cls=EXTENSION_CLS,
        served_model_name=str(model_dir),
        extra_args=("--logprobs-mode", "processed_logprobs"),
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    example = _example()
    root = tmp_path_factory.mktemp("trl-vllm")
    return Path(
        example.initial_model_dir(root, example.SIZES["engine"], example.build_tokenizer(), 0)
    )


@pytest.fixture()
def engine(model_dir: Path, tmp_path: Path) -> Iterator[VLLMServer]:
    # The harness's warm-up prompt is text this tokenizer (digits, '+', '=') makes nothing of.
    server = start_engine(model_dir, tmp_path, _settings(model_dir), warm=False)
    engine_logprobs(server)  # the first request's one-off costs, outside the steps
    yield server
    stop_engine(server)


@pytest.fixture(autouse=True)
def _unhook() -> Iterator[None]:
    yield
    remove_rlguard_weight_sync()


def requests_served(server: VLLMServer) -> float:
    """The engine's ``vllm:request_success_total``, all finish reasons."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total{")
    )


def engine_logprobs(server: VLLMServer) -> torch.Tensor:
    """The engine's log-probability of each token of :data:`PROMPT` after the ones before it."""
    body = {"model": server.model_name, "prompt": PROMPT, "max_tokens": 1, "echo": True,
            "logprobs": 0, "temperature": 0.0}  # fmt: skip
    answer = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
    values = answer["choices"][0]["logprobs"]["token_logprobs"][1 : len(PROMPT)]
    return torch.tensor([float(v) for v in values])


def model_logprobs(model_dir: Path, params: dict[str, torch.Tensor]) -> torch.Tensor:
    """The same, from the trainer's model class holding ``params``, in float32 without autocast.
    A fresh model, not a copy of the trainer's: Accelerate wraps the trainer's ``forward`` in
    a closure over the original module, which a deep copy would still call."""
    twin = AutoModelForCausalLM.from_pretrained(str(model_dir))
    twin.load_state_dict(params)
    twin.train(False)
    with torch.no_grad():
        logits = twin(torch.tensor([PROMPT])).logits[0, :-1].float()
    picked = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(PROMPT[1:])[:, None])
    return picked[:, 0]


class EngineCheck(TrainerCallback):
    """After each step: what the engine did during it and which weights it served."""

    def __init__(self, server: VLLMServer, trainer: Any, model_dir: Path) -> None:
        self.server = server
        self.trainer = trainer
        self.model_dir = model_dir
        self.rows: list[dict[str, Any]] = []
        self._params: dict[str, torch.Tensor] = {}
        self._served = 0.0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # The weights the step's generation runs with (TRL syncs them inside the step).
        self._params = {k: v.detach().clone() for k, v in kwargs["model"].state_dict().items()}
        self._served = requests_served(self.server)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        sync: RLGuardWeightSync = self.trainer.vllm_generation.vllm_client.rlguard
        served_during = requests_served(self.server) - self._served
        self.rows.append({
            "step": state.global_step,
            "target": sync.target,
            "served_versions": sync.served_versions(),
            "requests": served_during,
            "engine": engine_logprobs(self.server),
            "trainer": model_logprobs(self.model_dir, self._params),
        })  # fmt: skip


def _trainer(example: ModuleType, out: Path, server: VLLMServer, *extra: str) -> Any:
    args = example.parse_args([
        "--output_dir", str(out), "--size", "engine", "--max_steps", "4", "--save_steps", "100",
        "--rlguard", "off", "--snapshots", "off", "--vllm_server", server.url, *extra,
    ])  # fmt: skip
    trainer = example.build_trainer(args)
    trainer.args.learning_rate = LEARNING_RATE
    return trainer


def test_grpo_generates_on_the_engine_and_the_engine_serves_each_steps_weights(
    engine: VLLMServer, model_dir: Path, tmp_path: Path
) -> None:
    example = _example()
    trainer = _trainer(example, tmp_path / "out", engine)
    check = EngineCheck(engine, trainer, model_dir)
    trainer.add_callback(check)
    before = engine_logprobs(engine)
    trainer.train()

    assert [r["step"] for r in check.rows] == [1, 2, 3, 4]
    for row in check.rows:
        step = row["step"]
        # The step's completions came from the engine: TRL's one request per step, n=4 each.
        assert row["requests"] >= 1, row
        # It was refit to the weights the step generated with: version == the step's index.
        assert row["target"] == step - 1 and row["served_versions"] == [step - 1], row
        diff = (row["engine"] - row["trainer"]).abs().max().item()
        assert diff < TOLERANCE, (step, diff, row["engine"], row["trainer"])
    # The weights did move between the steps the engine served (the check above could fail).
    moved = (check.rows[-1]["engine"] - before).abs().max().item()
    assert moved > 20 * TOLERANCE, moved
    sync = trainer.vllm_generation.vllm_client.rlguard
    assert [r.version for r in sync.refits] == [0, 1, 2, 3]
    assert all(r.detail.get("pulled") for r in sync.refits)


def test_a_killed_engine_is_replaced_refit_and_training_goes_on(
    engine: VLLMServer, model_dir: Path, tmp_path: Path
) -> None:
    example = _example()
    trainer = _trainer(example, tmp_path / "out", engine, "--vllm_engine_wait", "300")
    replacement: dict[str, VLLMServer] = {}
    failures: list[BaseException] = []

    def restart() -> None:
        try:
            wait_for(lambda: not engine.running(), 60, "the API server to exit after its Worker")
            replacement["server"] = start_engine(
                model_dir, tmp_path / "again", _settings(model_dir), port=engine.port, warm=False
            )
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            failures.append(exc)

    class KillAfterStep2(TrainerCallback):
        params: dict[str, torch.Tensor] = {}

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            # the weights of the last step's generation, which the replacement must serve
            self.params = {k: v.detach().clone() for k, v in kwargs["model"].state_dict().items()}

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 2:
                for pid in engine.tree().workers:
                    os.kill(pid, signal.SIGKILL)
                threading.Thread(target=restart, daemon=True).start()

    (tmp_path / "again").mkdir()
    kill = KillAfterStep2()
    trainer.add_callback(kill)
    try:
        trainer.train()
        assert not failures, failures
        new = replacement["server"]
        sync = trainer.vllm_generation.vllm_client.rlguard
        # v2 was published for step 3 while the engine was down; the replacement was refit to
        # it before it generated, and to v3 for step 4.
        assert trainer.state.global_step == 4
        assert [r.version for r in sync.refits] == [0, 1, 2, 3]
        assert sync.served_versions() == [3] and sync.target == 3
        assert requests_served(new) >= 2  # steps 3 and 4 generated on the replacement
        # It serves v3, the weights step 4 generated with, not the ones it started with.
        diff = (engine_logprobs(new) - model_logprobs(model_dir, kill.params)).abs().max()
        assert diff.item() < TOLERANCE, diff

        # An engine restarted behind the client's back between a sync and a generation: TRL's
        # generate refits it to v3 before sampling from it (no push comes first this time).
        for pid in new.tree().workers:
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not new.running(), 60, "the replacement's API server to exit")
        stop_engine(new)
        (tmp_path / "third").mkdir()
        replacement["server"] = third = start_engine(
            model_dir, tmp_path / "third", _settings(model_dir), port=engine.port, warm=False
        )
        out = trainer.vllm_generation.vllm_client.generate(prompts=[PROMPT], n=2, max_tokens=4)
        assert len(out["completion_ids"]) == 2 and requests_served(third) >= 1
        assert [r.version for r in sync.refits] == [0, 1, 2, 3, 3]
        assert sync.served_versions() == [3]
        diff = (engine_logprobs(third) - model_logprobs(model_dir, kill.params)).abs().max()
        assert diff.item() < TOLERANCE, diff
    finally:
        if "server" in replacement:
            stop_engine(replacement["server"])


def test_an_engine_without_the_extension_is_refused() -> None:
    """TRL's own check names the missing dev mode; ours names the missing extension."""
    from integrations.trl.vllm_weights import check_server_info

    with pytest.raises(WeightSyncError, match="--worker-extension-cls " + EXTENSION_CLS):
        check_server_info({"parallel_config": {"worker_extension_cls": ""}}, "http://x:1")


def test_an_unsupported_trl_is_refused_naming_its_version(tmp_path: Path) -> None:
    site = tmp_path / "site"
    info = site / "trl-1.17.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: trl\nVersion: 1.17.0\n")
    code = (
        "import trl.generation.vllm_generation as g, integrations.trl.vllm_weights as w\n"
        "before = g.VLLMClient\n"
        "try:\n    w.use_rlguard_weight_sync()\n"
        "except w.IntegrationError as e:\n    print('REFUSED', e)\n"
        "assert g.VLLMClient is before\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "REFUSED" in done.stdout and "trl 1.17.0" in done.stdout, done.stdout
