"""The reference job with real inference engines as its rollout role (``--rollout-engine vllm``):
the engine processes, the trainer's router and admission, the task on a language model."""
