"""HFPolicy: shared-prefix generation is exact, logprobs are the model's, sampling is seeded."""

from __future__ import annotations

import pytest

from pivot_envs.adapters.chat_template import encode_prompt
from pivot_envs.adapters.policies.hf import HFPolicy
from pivot_envs.chat import tool_to_chat
from pivot_envs.policy import Policy, SamplingParams

CHATS = [
    {"messages": [{"role": "user", "content": "What is the capital of France?"}], "tools": []},
    {
        "messages": [
            {"role": "system", "content": "You are an airline agent."},
            {"role": "user", "content": "Is flight HAT069 on time? My user id is mia_li_3668."},
        ],
        "tools": [
            tool_to_chat(
                {
                    "name": "get_flight_status",
                    "description": "Status of a flight",
                    "parameters": {"type": "object", "properties": {"flight_number": {"type": "string"}}},
                }
            )
        ],
    },
]


@pytest.fixture(scope="module")
def model_and_tokenizer():
    import torch

    from pivot_envs.adapters import smollm2

    torch.set_num_threads(1)  # the test machine's cores are shared: one thread is much faster there
    torch.manual_seed(0)
    return smollm2.load()


@pytest.fixture(scope="module")
def policy(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    return HFPolicy(model, tokenizer, device="cpu", batch_size=4, name="hf:smollm2")


def fresh_logprobs(model, prompt: list[int], completion: list[int]) -> list[float]:
    """Log-softmax of one unpadded forward pass over prompt + completion, at the completion ids."""
    import torch

    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0].float()
    log_probs = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return log_probs.gather(-1, torch.tensor(completion)[:, None])[:, 0].tolist()


def test_hf_policy_is_a_policy_exposing_its_module(policy, model_and_tokenizer):
    assert isinstance(policy, Policy)
    assert policy.model is model_and_tokenizer[0]


def test_greedy_shared_prefix_generation_equals_per_sample_model_generate(policy, model_and_tokenizer):
    import torch

    model, tokenizer = model_and_tokenizer
    groups = policy.generate(CHATS, n=2, sampling=SamplingParams(temperature=0.0, max_new_tokens=12))
    assert [len(g) for g in groups] == [2, 2]
    for chat, group in zip(CHATS, groups):
        prompt = encode_prompt(tokenizer, chat["messages"], chat["tools"])
        with torch.inference_mode():
            reference = model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                do_sample=False,
                max_new_tokens=12,
                eos_token_id=sorted(policy.stop_ids),
                pad_token_id=policy.pad_id,
            )[0, len(prompt) :].tolist()
        for completion in group:
            assert completion.token_ids == reference
            assert completion.prompt_token_ids == prompt


def test_logprobs_are_the_log_softmax_of_a_fresh_forward_pass_at_the_sampled_ids(policy, model_and_tokenizer):
    model, _ = model_and_tokenizer
    groups = policy.generate(CHATS, n=3, sampling=SamplingParams(temperature=1.0, max_new_tokens=10, seed=3))
    for group in groups:
        for completion in group:
            expected = fresh_logprobs(model, completion.prompt_token_ids, completion.token_ids)
            assert len(completion.logprobs) == len(completion.token_ids) > 0
            assert completion.logprobs == pytest.approx(expected, abs=2e-4)


def test_sharing_the_prefix_cache_samples_exactly_what_recomputing_it_per_sample_does(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    sampling = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=10, seed=11)
    shared = HFPolicy(model, tokenizer, share_prefix=True).generate(CHATS, n=4, sampling=sampling)
    naive = HFPolicy(model, tokenizer, share_prefix=False).generate(CHATS, n=4, sampling=sampling)
    for shared_group, naive_group in zip(shared, naive):
        assert [c.token_ids for c in shared_group] == [c.token_ids for c in naive_group]
        for a, b in zip(shared_group, naive_group):
            assert a.logprobs == pytest.approx(b.logprobs, abs=2e-4)


def test_the_same_seed_reproduces_the_samples_and_another_seed_changes_them(policy):
    def run(seed):
        groups = policy.generate(
            CHATS, n=4, sampling=SamplingParams(temperature=1.0, max_new_tokens=8, seed=seed)
        )
        return [[c.token_ids for c in g] for g in groups]

    first = run(5)
    assert run(5) == first
    assert run(6) != first
    assert len({tuple(ids) for ids in first[0]}) > 1  # the n samples of one chat differ


def test_completions_stop_at_end_of_turn_or_at_the_token_budget(policy, model_and_tokenizer):
    _, tokenizer = model_and_tokenizer
    long = policy.generate(CHATS[:1], n=1, sampling=SamplingParams(temperature=0.0, max_new_tokens=64))[0][0]
    assert long.finish_reason == "stop" and long.token_ids[-1] in policy.stop_ids
    assert long.text == tokenizer.decode(long.token_ids[:-1]) and "<|im_end|>" not in long.text
    assert "Paris" in long.text
    short = policy.generate(CHATS[:1], n=1, sampling=SamplingParams(temperature=0.0, max_new_tokens=3))[0][0]
    assert short.finish_reason == "length" and len(short.token_ids) == 3
    assert short.token_ids == long.token_ids[:3]


def test_a_vanishing_top_p_is_greedy(policy):
    greedy = policy.generate(CHATS, n=1, sampling=SamplingParams(temperature=0.0, max_new_tokens=6))
    nucleus = policy.generate(
        CHATS, n=2, sampling=SamplingParams(temperature=1.5, top_p=1e-6, max_new_tokens=6, seed=1)
    )
    for g, group in zip(greedy, nucleus):
        assert all(c.token_ids == g[0].token_ids for c in group)


def test_batches_smaller_than_the_chat_list_give_the_same_greedy_output(model_and_tokenizer, policy):
    model, tokenizer = model_and_tokenizer
    sampling = SamplingParams(temperature=0.0, max_new_tokens=8)
    one_by_one = HFPolicy(model, tokenizer, batch_size=1).generate(CHATS, n=1, sampling=sampling)
    together = policy.generate(CHATS, n=1, sampling=sampling)
    assert [g[0].token_ids for g in one_by_one] == [g[0].token_ids for g in together]


def test_bad_arguments_are_clear_errors(model_and_tokenizer, policy):
    with pytest.raises(ValueError, match="batch_size"):
        HFPolicy(*model_and_tokenizer, batch_size=0)
    with pytest.raises(ValueError, match="n must be"):
        policy.generate(CHATS, n=0, sampling=SamplingParams())


def test_token_id_prompts_generate_without_a_tokenizer_and_an_empty_stop_list_never_stops(
    model_and_tokenizer, policy
):
    model, _ = model_and_tokenizer
    prompt = policy.encode(CHATS[0])
    bare = HFPolicy(model, None, stop_token_ids=[])
    (group,) = bare.generate_ids([prompt], 2, SamplingParams(temperature=0.0, max_new_tokens=20))
    (reference,) = policy.generate_ids([prompt], 1, SamplingParams(temperature=0.0, max_new_tokens=20))
    stop = reference[0].token_ids.index(next(t for t in reference[0].token_ids if t in policy.stop_ids))
    for completion in group:
        assert (
            len(completion.token_ids) == 20 and completion.finish_reason == "length" and completion.text == ""
        )
        assert completion.token_ids[: stop + 1] == reference[0].token_ids
    with pytest.raises(ValueError, match="no tokenizer"):
        bare.generate(CHATS, 1, SamplingParams())


def test_a_batch_shares_its_prompts_common_head_and_samples_what_whole_prompts_do(model_and_tokenizer):
    from pivot_envs.adapters.policies.hf import MIN_SHARED_HEAD
    from pivot_envs.domains.tool_use.env import bundled_pivots

    model, tokenizer = model_and_tokenizer
    airline = [pivot.observation for pivot in bundled_pivots()[:3]]  # the airline system prompt starts each
    chats = [airline[0], CHATS[0], airline[1], airline[2]]  # ... and one chat that shares nothing with them
    shared = HFPolicy(model, tokenizer, max_prompt_tokens=384)
    whole = HFPolicy(model, tokenizer, max_prompt_tokens=384, share_head=False)
    prompts = [shared.encode(chat) for chat in chats]
    assert whole._head_groups(prompts) == [(0, [0, 1, 2, 3])]
    (head, together), alone = shared._head_groups(prompts)
    assert together == [0, 2, 3] and alone == (0, [1]) and head >= MIN_SHARED_HEAD
    assert all(prompts[row][:head] == prompts[0][:head] for row in together)

    fed: list[int] = []  # tokens of every forward pass
    hook = model.register_forward_pre_hook(
        lambda _, args, kwargs: fed.append(kwargs["input_ids"].numel()), with_kwargs=True
    )
    try:
        sampling = SamplingParams(temperature=1.0, max_new_tokens=6, seed=4)
        with_head = shared.generate(chats, n=3, sampling=sampling)
        head_passes = list(fed)
        fed.clear()
        without = whole.generate(chats, n=3, sampling=sampling)
    finally:
        hook.remove()
    assert fed[0] == 4 * max(len(p) for p in prompts)  # whole prompts, left-padded to the longest
    tail = max(len(prompts[row]) for row in together) - head
    assert head_passes[:3] == [head, 3 * tail, len(prompts[1])]  # the head once, the tails, the other prompt
    for a_group, b_group in zip(with_head, without):
        assert [c.token_ids for c in a_group] == [c.token_ids for c in b_group]
        for a, b in zip(a_group, b_group):
            assert a.logprobs == pytest.approx(b.logprobs, abs=2e-4)
            assert a.prompt_token_ids == b.prompt_token_ids
    # ... and both are the model's own log-probabilities of a fresh unpadded pass, in the chats' order.
    for row in (1, 2):
        first = with_head[row][0]
        assert first.prompt_token_ids == prompts[row]
        assert first.logprobs == pytest.approx(fresh_logprobs(model, prompts[row], first.token_ids), abs=2e-4)


def test_the_cache_goes_by_the_installed_transformers_name_with_no_deprecation_warning(model_and_tokenizer):
    """transformers renamed `past_key_values` to `cache` (the old name to go in 5.40): generation with
    a shared head passes a cache in and reads one back by the installed name. (pyproject's pytest
    filterwarnings makes the old name's warning an error in every test: SFT and GRPO scoring too.)"""
    import inspect
    import warnings

    from pivot_envs.adapters.kv_cache import cache_name
    from pivot_envs.adapters.sft import common_prefix_length

    model, tokenizer = model_and_tokenizer
    assert cache_name() in inspect.signature(type(model).forward).parameters
    policy = HFPolicy(model, tokenizer, device="cpu", batch_size=4)
    chats = [
        CHATS[1],
        {**CHATS[1], "messages": [*CHATS[1]["messages"][:1], {"role": "user", "content": "hi"}]},
    ]
    prompts = [policy.encode(chat) for chat in chats]
    assert common_prefix_length(prompts) >= 16  # the head is prefilled once, then passed as a cache
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*")
        groups = policy.generate(chats, 2, SamplingParams(temperature=1.0, max_new_tokens=4, seed=0))
    assert [len(group) for group in groups] == [2, 2]
