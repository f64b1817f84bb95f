"""What a warm standby of ``rlguard launch --standby --integration trl`` does before it waits:
one throwaway GRPO-shaped step on a tiny model of its own, so that the work a fresh process's
first step pays once is already paid when the standby becomes the trainer.

What that once-only work is (measured, ``benchmarks/trl_first_step.py``): the first call of each
ATen/autograd op (dispatch tables, oneDNN/BLAS kernel selection and their thread pools), the
first ``generate`` (generation config, logits processors, the KV cache classes), the first
AdamW step (the foreach kernels; the optimizer *state* itself is the run's model's and cannot be
allocated ahead) and the allocator's first growth.

The run must stay bit-identical: every RNG state (Python, NumPy, torch CPU and CUDA) is saved
before and restored after, the throwaway model is dropped, and torch's thread count and default
dtype are put back. Nothing of the run's (its model, tokenizer, data) exists yet when this runs.
"""

from __future__ import annotations

import random
from typing import Any

# Big enough that the kernels the run's matmuls take are the ones selected here (the
# example's "full" size is 512 wide), small enough to cost well under a second.
_HIDDEN = 128
_LAYERS = 2
_HEADS = 4
_ALPHABET = "0123456789+="  # with the four special tokens: a vocabulary of 16
_VOCAB = 4 + len(_ALPHABET)


def _rng_states() -> dict[str, Any]:
    import numpy as np
    import torch

    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.random.get_rng_state(),
    }
    cuda: Any = torch.cuda
    if cuda.is_available() and cuda.is_initialized():
        states["cuda"] = cuda.get_rng_state_all()
    return states


def _restore(states: dict[str, Any]) -> None:
    import numpy as np
    import torch

    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.random.set_rng_state(states["torch"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])


def _throwaway_step() -> None:
    """Generate, score (forward with and without grad), backward and an AdamW step, as GRPO
    does, on a model no one else sees."""
    import torch

    from integrations.vllm.tiny_model import TinyModelSpec, build_model, build_tokenizer

    # The project's tiny Qwen2 (pad 0, eos 1, bos 2), at the warm-up's size.
    spec = TinyModelSpec(
        hidden=_HIDDEN, layers=_LAYERS, heads=_HEADS, max_positions=64, alphabet=_ALPHABET
    )
    model: Any = build_model(spec, build_tokenizer(spec.alphabet))
    prompts = torch.randint(3, _VOCAB, (4, 4))
    mask = torch.ones_like(prompts)
    model.eval()
    with torch.no_grad():
        out = model.generate(
            input_ids=prompts,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            max_new_tokens=8,
            min_new_tokens=4,
            pad_token_id=0,
            eos_token_id=1,
        )
        model(input_ids=out, attention_mask=torch.ones_like(out))  # the reference's logprobs
    model.train()
    # The Trainer's default optimizer on this torch is the fused AdamW (adamw_torch_fused):
    # its kernel is what the run's first step would set up.
    try:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    except (RuntimeError, ValueError):  # a torch or device without the fused kernel
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    logits = model(input_ids=out, attention_mask=torch.ones_like(out)).logits
    logps = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    token_logps = logps.gather(-1, out[:, 1:].unsqueeze(-1)).squeeze(-1)
    loss: Any = (torch.exp(token_logps - token_logps.detach()) * -1.0).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def warm_up() -> None:
    """Pay a GRPO step's once-only costs now, leaving every RNG and torch setting as it was."""
    import torch

    states = _rng_states()
    threads = torch.get_num_threads()
    dtype = torch.get_default_dtype()
    try:
        _throwaway_step()
    finally:
        _restore(states)
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)
