"""VLLMPolicy: same prompts and greedy tokens as the hf backend, exact logprobs, in-place weight updates.

vLLM needs its wheel and a GPU; where it does not import, these tests skip (CI accepts that skip).
"""

from __future__ import annotations

import importlib.util

import pytest

from pivot_envs.policy import SamplingParams, load_policy

pytestmark = [
    pytest.mark.skip_ok_in_ci(reason="CI cannot install the vLLM wheel"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]

CHATS = [
    {"messages": [{"role": "user", "content": "What is the capital of France?"}], "tools": []},
    {"messages": [{"role": "user", "content": "Name three colors."}], "tools": []},
]


@pytest.fixture(scope="module")
def vllm_policy():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("vLLM needs a CUDA device here")
    return load_policy("vllm:smollm2", dtype="float32", gpu_memory_utilization=0.3, max_model_len=2048)


@pytest.fixture(scope="module")
def hf_policy():
    from pivot_envs.adapters.policies.hf import HFPolicy

    return HFPolicy.from_pretrained("smollm2", device="cuda")


def test_greedy_samples_and_prompts_equal_the_hf_backend(vllm_policy, hf_policy):
    sampling = SamplingParams(temperature=0.0, max_new_tokens=16)
    ours = vllm_policy.generate(CHATS, n=2, sampling=sampling)
    reference = hf_policy.generate(CHATS, n=1, sampling=sampling)
    for group, (expected,) in zip(ours, reference):
        assert len(group) == 2
        for completion in group:
            assert completion.prompt_token_ids == expected.prompt_token_ids
            assert completion.token_ids == expected.token_ids
            assert completion.logprobs == pytest.approx(expected.logprobs, abs=1e-3)


def test_n_seeded_samples_are_reproducible_and_differ_within_a_group(vllm_policy):
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, seed=7)
    first = vllm_policy.generate(CHATS[:1], n=4, sampling=sampling)[0]
    again = vllm_policy.generate(CHATS[:1], n=4, sampling=sampling)[0]
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert len({tuple(c.token_ids) for c in first}) > 1


def test_update_weights_changes_the_engine_in_place_and_restoring_them_restores_the_output(vllm_policy, hf_policy):
    import torch

    sampling = SamplingParams(temperature=0.0, max_new_tokens=8)
    before = vllm_policy.generate(CHATS[:1], n=1, sampling=sampling)[0][0].token_ids
    original = {k: v.detach().clone() for k, v in hf_policy.model.state_dict().items()}
    noisy = {k: v + 0.5 * torch.randn_like(v) for k, v in original.items()}
    vllm_policy.update_weights(noisy)
    assert vllm_policy.generate(CHATS[:1], n=1, sampling=sampling)[0][0].token_ids != before
    vllm_policy.update_weights(original)
    assert vllm_policy.generate(CHATS[:1], n=1, sampling=sampling)[0][0].token_ids == before
