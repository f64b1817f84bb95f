"""The vLLM server's environment (integrations.vllm.server.engine_env)."""

from __future__ import annotations

from integrations.vllm.server import EngineSettings, engine_env


def test_engines_are_not_pinned_to_the_same_cores_unless_the_operator_says_so() -> None:
    env = engine_env(EngineSettings(), base={})
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    mine = engine_env(EngineSettings(), base={"VLLM_CPU_OMP_THREADS_BIND": "0-3"})
    assert mine["VLLM_CPU_OMP_THREADS_BIND"] == "0-3"


def test_the_settings_extra_env_comes_last() -> None:
    settings = EngineSettings(extra_env={"VLLM_CPU_OMP_THREADS_BIND": "auto", "X": "1"})
    env = engine_env(settings, base={"X": "0"})
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "auto" and env["X"] == "1"
