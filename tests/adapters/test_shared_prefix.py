"""The shared prefix is exact: one prefix pass shared by G actions gives the per-sequence logprobs and gradients,
and so does one pass over several groups' prefixes and one over all their actions."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pivot_envs.adapters.grpo.shared_prefix import (  # noqa: E402
    action_logprobs,
    groups_logprobs,
    repeat_cache_rows,
    sequence_logprobs,
)


@pytest.fixture(scope="module")
def smollm2():
    from pivot_envs.adapters import smollm2

    torch.set_num_threads(1)  # the test machine's cores are shared: one thread is much faster there
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


def _relative_difference(grads, reference):
    difference = torch.sqrt(sum(((grads[k] - reference[k]) ** 2).sum() for k in reference))
    return difference / torch.sqrt(sum((g**2).sum() for g in reference.values()))


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
    assert _relative_difference(shared_grads, naive_grads) < 1e-5
    embedding = (
        "model.embed_tokens.weight"  # the prefix's own tokens get gradient only through the shared pass
    )
    assert shared_grads[embedding][prefix[0]].abs().sum() > 0


@pytest.mark.slow
def test_groups_in_one_pass_give_each_group_its_own_logprobs_and_the_summed_gradients(smollm2):
    generator = torch.Generator().manual_seed(2)
    # prefixes of different lengths (right padding of the prefix pass), a group with a single action,
    # actions of length 1 and of different lengths (right padding of the action pass)
    groups = [
        (_random_ids(generator, 57), [_random_ids(generator, n) for n in (6, 1, 3)]),
        (_random_ids(generator, 9), [_random_ids(generator, 4)]),
        (_random_ids(generator, 33), [_random_ids(generator, n) for n in (1, 8)]),
    ]
    smollm2.zero_grad(set_to_none=True)
    batched, mask, _ = groups_logprobs(smollm2, groups)
    (batched * mask).sum().backward()
    batched_grads = {
        name: p.grad.detach().clone() for name, p in smollm2.named_parameters() if p.grad is not None
    }
    smollm2.zero_grad(set_to_none=True)
    assert batched.shape == (6, 8) and mask.sum().item() == 23

    row, per_group, naive_grads = 0, {}, {}
    for prefix, actions in groups:
        shared, shared_mask, grads = _logprobs_and_grads(smollm2, action_logprobs, prefix, actions)
        naive, naive_mask, naive_group_grads = _logprobs_and_grads(
            smollm2, sequence_logprobs, prefix, actions
        )
        rows = slice(row, row + len(actions))
        row += len(actions)
        width = shared.shape[1]
        assert torch.equal(mask[rows, :width], shared_mask) and not mask[rows, width:].any()
        torch.testing.assert_close(
            batched[rows, :width][shared_mask], shared[shared_mask], rtol=1e-5, atol=5e-5
        )
        torch.testing.assert_close(
            batched[rows, :width][shared_mask], naive[naive_mask], rtol=1e-5, atol=5e-5
        )
        for name in grads:
            per_group[name] = per_group.get(name, 0) + grads[name]
            naive_grads[name] = naive_grads.get(name, 0) + naive_group_grads[name]

    assert batched_grads.keys() == per_group.keys() == naive_grads.keys() and len(batched_grads) > 20
    # float32 rounding over 30 layers: the per-group and the naive gradients differ by 2.4e-5 here themselves
    assert _relative_difference(batched_grads, per_group) < 5e-5
    assert _relative_difference(batched_grads, naive_grads) < 5e-5
    embedding = batched_grads[
        "model.embed_tokens.weight"
    ]  # every prefix gets its gradient through the shared pass
    assert all(embedding[prefix[0]].abs().sum() > 0 for prefix, _ in groups)


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
    config = LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    model = LlamaForCausalLM(config).eval()
    shared, mask, _ = action_logprobs(model, [5, 6, 7, 8], [[1], [2], [3]])
    naive, _ = sequence_logprobs(model, [5, 6, 7, 8], [[1], [2], [3]])
    assert shared.shape == (3, 1)
    torch.testing.assert_close(shared, naive, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_gradients_repeat_bit_for_bit_on_several_threads():
    """The same groups give the same gradients to the last bit, run after run, with two CPU threads.

    The prefix's key/value cache and last logits are repeated to the group's actions; done by indexing
    (`cache.batch_select_indices`), the backward accumulated the copies with parallel atomic adds, so
    the gradients differed in their last bits from one run to the next and a seeded training run could
    not be repeated. Before `repeat_rows`, every repeat differed (three tries of 5 repeats).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(  # 9 key/value heads x 64 over a long prefix: a cache as large as a small LM's
        vocab_size=256,
        hidden_size=576,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=9,
        num_key_value_heads=9,
        max_position_embeddings=2048,
    )
    model = LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, 256, (n,), generator=generator).tolist() for n in (1200, 9, 12, 5, 7, 3, 8, 6, 4)]
    groups = [(ids[0], ids[1:])]  # one prefix, 8 actions: 8 copies of each cache row
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # one thread accumulates serially: the race needs two
    try:
        runs = []
        for _ in range(4):
            model.zero_grad(set_to_none=True)
            logprobs, mask, _ = groups_logprobs(model, groups)
            (logprobs * mask).sum().backward()
            runs.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    finally:
        torch.set_num_threads(threads)
    assert runs[0].abs().sum() > 0
    differing = sum(not torch.equal(run, runs[0]) for run in runs[1:])
    assert differing == 0, f"{differing} of 3 repeats gave other gradients"


def test_cache_layers_with_more_state_than_keys_and_values_repeat_all_of_it():
    """A plain layer's keys and values are repeated by `repeat_rows`; a layer with more state (here an indexer's
    keys, as DeepSeek V3.2's) keeps its own `batch_select_indices`, so none of its state is left unrepeated."""
    from transformers.cache_utils import Cache, DynamicIndexedLayer, DynamicLayer

    cache = Cache(layers=[DynamicLayer(), DynamicIndexedLayer()])
    keys = torch.arange(12, dtype=torch.float).reshape(2, 1, 3, 2)  # [batch, heads, tokens, head dim]
    for layer in cache.layers:
        layer.update(keys, keys + 100)
    indexer = torch.arange(24, dtype=torch.float).reshape(2, 3, 4)
    cache.layers[1].update_indexer(indexer)
    repeat_cache_rows(cache, [2, 3])
    rows = torch.tensor([0, 0, 1, 1, 1])
    for layer in cache.layers:
        assert torch.equal(layer.keys, keys[rows]) and torch.equal(layer.values, keys[rows] + 100)
    assert torch.equal(cache.layers[1].indexer_keys, indexer[rows])
