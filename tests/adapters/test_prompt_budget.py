"""Fitting long pivot prompts to a token budget (for small models on a CPU budget)."""

from __future__ import annotations

import logging

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


def test_the_hf_policy_reads_its_context_window_from_the_model_config(tokenizer) -> None:
    from tiny_model import tiny_policy

    assert tiny_policy(tokenizer, max_position_embeddings=256).context_window == 256
    # SmolLM2's tokenizer says no limit (1e30): the config's 8192 is the window.
    from pivot_envs.adapters.chat_template import context_window

    assert context_window(None, tokenizer) is None


def test_prompts_past_the_context_window_are_fitted_and_noticed_once(tokenizer, pivots, caplog) -> None:
    from tiny_model import tiny_policy

    from pivot_envs.policy import SamplingParams

    policy = tiny_policy(tokenizer, max_position_embeddings=256)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=0)
    chats = [pivot.observation for pivot in pivots[:3]]
    assert all(len(encode_prompt(tokenizer, c["messages"], c["tools"])) > 248 for c in chats)
    with caplog.at_level(logging.WARNING, logger="pivot_envs.adapters.chat_template"):
        groups = policy.generate(chats, 2, sampling)
        policy.generate(chats[:2], 2, sampling)
    for group in groups:
        assert len(group) == 2
        assert len(group[0].prompt_token_ids) <= 256 - 8
        assert all(len(c.token_ids) >= 1 for c in group)
    notices = [r.getMessage() for r in caplog.records if "--max-prompt-tokens" in r.getMessage()]
    assert len(notices) == 1
    assert "3 of 3 prompts" in notices[0] and "context window of 256 tokens less 8 new tokens" in notices[0]
    assert policy.fitter.fitted == 5


def test_the_user_budget_applies_when_it_is_tighter_than_the_window(tokenizer, pivots) -> None:
    from tiny_model import tiny_policy

    from pivot_envs.adapters.policies.hf import HFPolicy

    tiny = tiny_policy(tokenizer, max_position_embeddings=256)
    policy = HFPolicy(tiny.model, tokenizer, max_prompt_tokens=200)
    assert len(policy.encode(pivots[0].observation, max_new_tokens=8)) <= 200
    assert policy.fitter.limit(8) == "--max-prompt-tokens 200"
    loose = HFPolicy(tiny.model, tokenizer, max_prompt_tokens=4096)
    assert len(loose.encode(pivots[0].observation, max_new_tokens=8)) <= 248


def test_what_cannot_fit_the_window_stops_before_generating_with_one_line(tokenizer, pivots) -> None:
    from tiny_model import tiny_policy

    from pivot_envs.adapters.chat_template import PromptTooLongError
    from pivot_envs.errors import PivotEnvsError
    from pivot_envs.policy import SamplingParams

    policy = tiny_policy(tokenizer, max_position_embeddings=256)
    with pytest.raises(PromptTooLongError, match="lower --max-new-tokens") as error:
        policy.generate([pivots[0].observation], 1, SamplingParams(max_new_tokens=300))
    assert isinstance(error.value, PivotEnvsError) and "\n" not in str(error.value)
    # A window that leaves less than the chat template's own tokens: no rule can fit the prompt.
    with pytest.raises(PromptTooLongError, match="--max-prompt-tokens") as error:
        policy.generate([pivots[0].observation], 1, SamplingParams(max_new_tokens=250))
    assert "\n" not in str(error.value)
    with pytest.raises(PromptTooLongError, match="--max-prompt-tokens"):
        policy.generate_ids([[1] * 250], 1, SamplingParams(max_new_tokens=8))
