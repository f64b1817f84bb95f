"""A tiny causal LM built from a config, saved in Hugging Face format for vLLM to serve.

Nothing is downloaded: the tokenizer is a character-level one built here with ``tokenizers``
(the same construction as the TRL example's, over a wider alphabet so that ordinary prompts
tokenize), and the model is a randomly initialised, seeded Qwen2 (an architecture vLLM serves
natively). Its sizes are chosen for vLLM's CPU backend: a head size of 32 is one its attention
kernels support, and float32 weights avoid the bf16 paths that die with SIGILL on CPUs without
AVX-512 BF16.
"""

from __future__ import annotations

import os
import string
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
# Printable ASCII without the whitespace controls other than space and newline.
DEFAULT_ALPHABET = "".join(c for c in string.printable if c not in "\t\r\x0b\x0c")


@dataclass(frozen=True)
class TinyModelSpec:
    """The model's shape. The defaults start in vLLM in seconds and generate thousands of
    tokens a second on one CPU core."""

    hidden: int = 64
    layers: int = 2
    heads: int = 2
    max_positions: int = 512
    alphabet: str = DEFAULT_ALPHABET
    seed: int = 0

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not a multiple of heads={self.heads}")
        if len(set(self.alphabet)) != len(self.alphabet):
            raise ValueError("alphabet has repeated characters")


def build_tokenizer(alphabet: str = DEFAULT_ALPHABET) -> PreTrainedTokenizerFast:
    """A character-level tokenizer: the four special tokens, then one id per character."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([PAD, EOS, BOS, UNK, *alphabet])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=core, pad_token=PAD, eos_token=EOS, bos_token=BOS, unk_token=UNK
    )


def build_model(spec: TinyModelSpec, tokenizer: PreTrainedTokenizerFast) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 of ``spec``, seeded: the same spec gives the same weights."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(spec.seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden,
        intermediate_size=spec.hidden * 2,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.heads,
        max_position_embeddings=spec.max_positions,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config)  # type: ignore[no-untyped-call]


def save_tiny_model(directory: Path, spec: TinyModelSpec | None = None) -> Path:
    """Build the model of ``spec`` and its tokenizer and save them to ``directory`` (created),
    ready for ``vllm`` and ``transformers`` to load. The directory appears whole or not at all
    (written beside it, then renamed), and an existing complete one is reused as it is."""
    spec = spec or TinyModelSpec()
    directory = Path(directory)
    if (directory / "config.json").is_file():
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.with_name(f".{directory.name}.{os.getpid()}.tmp")
    tokenizer = build_tokenizer(spec.alphabet)
    build_model(spec, tokenizer).save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    os.replace(tmp, directory)
    return directory
