"""Fitting long pivot prompts to a token budget (for small models on a CPU budget)."""

from __future__ import annotations

import gymnasium as gym
import pytest

import pivot_envs  # noqa: F401  (registers the envs)
from pivot_envs.adapters.chat_template import encode_prompt, fit_prompt, render_prompt


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from pivot_envs.adapters import smollm2

    return AutoTokenizer.from_pretrained(smollm2.checkpoint())


@pytest.fixture(scope="module")
def pivots():
    env = gym.make("pivot/tool-use-v0")
    yield env.unwrapped.pivots
    env.close()


def test_a_prompt_within_the_budget_is_rendered_unchanged(tokenizer, pivots) -> None:
    pivot = pivots[0]
    whole = encode_prompt(tokenizer, pivot.messages, pivot.tools)
    assert encode_prompt(tokenizer, pivot.messages, pivot.tools, max_tokens=len(whole)) == whole
    assert fit_prompt(tokenizer, pivot.messages, pivot.tools, len(whole)) == render_prompt(
        tokenizer, pivot.messages, pivot.tools
    )


@pytest.mark.parametrize("budget", [768, 1024, 2048])
def test_long_prompts_fit_the_budget_and_keep_the_last_turn(tokenizer, pivots, budget: int) -> None:
    for pivot in pivots[:400:40]:
        whole = encode_prompt(tokenizer, pivot.messages, pivot.tools)
        fitted = encode_prompt(tokenizer, pivot.messages, pivot.tools, max_tokens=budget)
        assert len(whole) > budget >= len(fitted) > budget * 0.8  # cut only as far as needed
        text = fit_prompt(tokenizer, pivot.messages, pivot.tools, budget)
        last = pivot.messages[-1]
        if last["role"] == "user":
            assert last["content"].strip()[-40:] in text
        assert text.endswith("<|im_start|>assistant\n")


def test_the_hf_policy_applies_its_prompt_budget(tokenizer, pivots) -> None:
    from pivot_envs.adapters import smollm2
    from pivot_envs.adapters.policies.hf import HFPolicy

    model, _ = smollm2.load()
    policy = HFPolicy(model, tokenizer, max_prompt_tokens=900)
    assert len(policy.encode(pivots[10].observation)) <= 900
    assert len(HFPolicy(model, tokenizer).encode(pivots[10].observation)) > 900
