"""The tiny test model, built in one place: a randomly initialised model of SmolLM2's architecture with
SmolLM2's own tokenizer, small enough to train in seconds on a CPU.

    from tiny_model import tiny_model, tiny_policy, tiny_config, tiny_checkpoint, smollm2_tokenizer

Seeded: the same arguments give the same weights, so a test's outcome is repeatable.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=16384,  # the bundled tool-use prompts run past 4k tokens
    tie_word_embeddings=True,
)


@functools.cache
def smollm2_tokenizer() -> Any:
    """SmolLM2-135M-Instruct's tokenizer, from the embedded checkpoint (cached per process)."""
    from transformers import AutoTokenizer

    from pivot_envs.adapters import smollm2

    return AutoTokenizer.from_pretrained(smollm2.checkpoint())


def tiny_model(tokenizer: Any = None, seed: int = 0, **shape: Any) -> Any:
    """A fresh `LlamaForCausalLM` in eval mode, seeded; `shape` overrides fields of `SHAPE`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tokenizer or smollm2_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id, **{**SHAPE, **shape})
    return LlamaForCausalLM(config).eval()


def tiny_policy(tokenizer: Any = None, seed: int = 0, **shape: Any) -> Any:
    """The tiny model as an `HFPolicy` named "hf:tiny"."""
    from pivot_envs.adapters.policies.hf import HFPolicy

    tokenizer = tokenizer or smollm2_tokenizer()
    return HFPolicy(tiny_model(tokenizer, seed, **shape), tokenizer, name="hf:tiny")


def tiny_config(out: Path, **overrides: Any) -> Any:
    """A `GRPOConfig` for the tiny model's runs: a few short steps, small groups, two envs; `overrides` win."""
    from pivot_envs.adapters.grpo import GRPOConfig

    values: dict[str, Any] = dict(
        batch_pivots=2,
        group_size=4,
        max_new_tokens=6,
        learning_rate=1e-3,
        steps=4,
        checkpoint_every=2,
        eval_every=0,
        num_envs=2,
        out=str(out),
        seed=3,
    )
    return GRPOConfig(**{**values, **overrides})


def tiny_checkpoint(path: Path, tokenizer: Any = None, seed: int = 0, **shape: Any) -> Path:
    """The tiny model and its tokenizer saved under `path` (a directory `hf:PATH` loads); returns `path`."""
    tokenizer = tokenizer or smollm2_tokenizer()
    tiny_model(tokenizer, seed, **shape).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return Path(path)
