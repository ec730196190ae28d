"""The shared prefix is exact: one prefix pass shared by G actions gives the per-sequence logprobs and gradients."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pivot_envs.adapters.grpo import action_logprobs, sequence_logprobs  # noqa: E402


@pytest.fixture(scope="module")
def smollm2():
    from pivot_envs.adapters import smollm2

    torch.set_num_threads(2)
    model, _ = smollm2.load(dtype=torch.float32)
    return model


def _random_ids(generator, length):
    return torch.randint(0, 49152, (length,), generator=generator).tolist()


def _logprobs_and_grads(model, function, prefix, actions):
    model.zero_grad(set_to_none=True)
    logprobs, mask = function(model, prefix, actions)[:2]
    (logprobs * mask).sum().backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return logprobs.detach(), mask, grads


@pytest.mark.slow
def test_shared_prefix_logprobs_and_gradients_equal_the_per_sequence_computation(smollm2):
    generator = torch.Generator().manual_seed(0)
    prefix = _random_ids(generator, 96)
    actions = [_random_ids(generator, n) for n in (7, 3, 1, 5)]  # unequal lengths: right padding is exercised
    shared, shared_mask, shared_grads = _logprobs_and_grads(smollm2, action_logprobs, prefix, actions)
    naive, naive_mask, naive_grads = _logprobs_and_grads(smollm2, sequence_logprobs, prefix, actions)

    assert torch.equal(shared_mask, naive_mask)
    assert shared_mask.sum().item() == 16
    torch.testing.assert_close(shared[shared_mask], naive[naive_mask], rtol=1e-5, atol=5e-5)
    assert shared_grads.keys() == naive_grads.keys() and len(shared_grads) > 20
    difference = torch.sqrt(sum(((shared_grads[k] - naive_grads[k]) ** 2).sum() for k in naive_grads))
    norm = torch.sqrt(sum((g**2).sum() for g in naive_grads.values()))
    assert norm > 0
    assert difference / norm < 1e-5
    embedding = "model.embed_tokens.weight"  # the prefix's own tokens get gradient only through the shared pass
    assert shared_grads[embedding][prefix[0]].abs().sum() > 0


@pytest.mark.slow
def test_shared_prefix_at_a_temperature_scores_the_tempered_distribution(smollm2):
    generator = torch.Generator().manual_seed(1)
    prefix, actions = _random_ids(generator, 40), [_random_ids(generator, 4), _random_ids(generator, 2)]
    with torch.no_grad():
        cold, mask = action_logprobs(smollm2, prefix, actions, temperature=0.5)[:2]
        warm, _ = sequence_logprobs(smollm2, prefix, actions, temperature=0.5)
        plain, _ = sequence_logprobs(smollm2, prefix, actions, temperature=1.0)
    torch.testing.assert_close(cold[mask], warm[mask], rtol=1e-5, atol=5e-5)
    assert not torch.allclose(cold[mask], plain[mask], atol=1e-3)


def test_single_token_actions_need_no_second_pass():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = LlamaForCausalLM(config).eval()
    shared, mask, _ = action_logprobs(model, [5, 6, 7, 8], [[1], [2], [3]])
    naive, _ = sequence_logprobs(model, [5, 6, 7, 8], [[1], [2], [3]])
    assert shared.shape == (3, 1)
    torch.testing.assert_close(shared, naive, rtol=1e-5, atol=1e-6)
