"""`pivot_sdpa` (adapters/attention.py): transformers' `sdpa` with the key/value heads repeated where SDPA would
otherwise get grouped float32 heads without a mask (on CUDA, a case only the math kernel takes). Its repeated
path gives sdpa's logprobs and gradients; everywhere else it is sdpa bit for bit; the trainer switches to it and
a saved model does not carry it."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from tiny_model import tiny_model, tiny_policy  # noqa: E402

from pivot_envs.adapters import attention  # noqa: E402
from pivot_envs.adapters.grpo.policy import trainable_module  # noqa: E402
from pivot_envs.adapters.grpo.shared_prefix import groups_logprobs  # noqa: E402


def _logprobs_and_grads(model, groups):
    model.zero_grad(set_to_none=True)
    logprobs, mask, _ = groups_logprobs(model, groups)
    (logprobs * mask).sum().backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return logprobs.detach(), mask, grads


def _groups(lengths):
    generator = torch.Generator().manual_seed(1)
    draw = lambda n: torch.randint(0, 1000, (n,), generator=generator).tolist()  # noqa: E731
    return [(draw(length), [draw(5), draw(3), draw(1)]) for length in lengths]


@pytest.fixture
def counted(monkeypatch):
    """Counts the attention calls that take the repeated path."""
    calls = []
    real = attention.ungroups

    def ungroups(query, key, mask):
        calls.append(real(query, key, mask))
        return calls[-1]

    monkeypatch.setattr(attention, "ungroups", ungroups)
    return calls


@pytest.fixture
def sdpa_calls(monkeypatch):
    """What each call of torch's scaled_dot_product_attention got: (query heads, key heads, enable_gqa, masked)."""
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def recorded(query, key, value, attn_mask=None, **kwargs):
        calls.append((query.shape[1], key.shape[1], kwargs.get("enable_gqa", False), attn_mask is not None))
        return real(query, key, value, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recorded)
    return calls


def test_no_call_reaches_sdpa_grouped_and_unmasked_in_float32(monkeypatch, sdpa_calls):
    """The case no fused CUDA kernel takes in float32 (grouped heads, no mask) is what plain sdpa hands torch at a
    one-prefix pass; after the switch every call has as many key heads as query heads, or a mask."""
    groups = _groups((40,))
    groups_logprobs(tiny_model(), groups)
    grouped_unmasked = (4, 2, True, False)  # the math kernel's call on CUDA in float32
    assert grouped_unmasked in sdpa_calls  # plain sdpa
    sdpa_calls.clear()
    monkeypatch.setattr(attention, "UNGROUPED_ON", frozenset({"cpu"}))
    model = tiny_model()
    attention.use_linear_memory_attention(model)
    groups_logprobs(model, groups)
    assert sdpa_calls and all(q == k or masked for q, k, _, masked in sdpa_calls)
    assert not any(gqa for *_, gqa, masked in sdpa_calls if not masked)


@pytest.mark.parametrize("lengths", [(40,), (40, 40), (40, 23)], ids=["one-prefix", "equal", "padded"])
def test_the_repeated_path_gives_sdpas_logprobs_and_gradients(monkeypatch, counted, lengths):
    """With the CPU counted as a device that needs it, the prefix pass of one prefix (or of prefixes of one
    length) takes the repeated path, and the logprobs and every gradient equal plain sdpa's."""
    reference = _logprobs_and_grads(tiny_model(), _groups(lengths))
    monkeypatch.setattr(attention, "UNGROUPED_ON", frozenset({"cpu"}))
    model = tiny_model()
    assert attention.use_linear_memory_attention(model)
    logprobs, mask, grads = _logprobs_and_grads(model, _groups(lengths))

    assert any(counted) == (len(set(lengths)) == 1)  # padding gives a mask: transformers repeats it itself
    assert torch.equal(mask, reference[1])
    torch.testing.assert_close(logprobs[mask], reference[0][mask], rtol=1e-5, atol=1e-5)
    assert grads.keys() == reference[2].keys() and len(grads) > 10
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference[2][name], rtol=1e-4, atol=1e-6, msg=name)


def test_on_a_cpu_it_is_sdpa_bit_for_bit(counted):
    reference = _logprobs_and_grads(tiny_model(), _groups((40,)))
    model = tiny_model()
    assert attention.use_linear_memory_attention(model)
    logprobs, _, grads = _logprobs_and_grads(model, _groups((40,)))

    assert counted and not any(counted)  # it ran, and left every call to sdpa
    assert torch.equal(logprobs, reference[0])
    assert all(torch.equal(grads[name], reference[2][name]) for name in grads)


def test_it_ungroups_only_grouped_float32_attention_without_a_mask(monkeypatch):
    query, key = torch.zeros(1, 4, 8, 16), torch.zeros(1, 2, 8, 16)
    assert not attention.ungroups(query, key, None)  # a CPU's kernels take grouped heads
    monkeypatch.setattr(attention, "UNGROUPED_ON", frozenset({"cpu"}))
    assert attention.ungroups(query, key, None)
    assert not attention.ungroups(query, key, torch.ones(1, 1, 8, 8, dtype=torch.bool))  # sdpa repeats itself
    assert not attention.ungroups(query.bfloat16(), key.bfloat16(), None)  # flash takes grouped 16-bit heads
    assert not attention.ungroups(query[:, :, :1], key, None)  # one query: decoding packs the heads instead
    assert not attention.ungroups(query, torch.zeros(1, 4, 8, 16), None)  # not grouped


def test_the_trainer_switches_its_module_and_a_saved_model_does_not_carry_it(tmp_path):
    policy = tiny_policy()
    module = trainable_module(policy)
    assert module.config._attn_implementation == attention.ATTENTION
    module.save_pretrained(tmp_path)
    assert attention.ATTENTION not in json.dumps(json.loads((tmp_path / "config.json").read_text()))

    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(tmp_path).config._attn_implementation == "sdpa"


def test_other_attentions_are_left_as_chosen():
    model = tiny_model()
    model.set_attn_implementation("eager")
    assert not attention.use_linear_memory_attention(model)
    assert model.config._attn_implementation == "eager"


def test_a_lora_wrapper_is_switched_through_its_base():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(tiny_model(), peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert attention.use_linear_memory_attention(model)
    assert model.get_base_model().config._attn_implementation == attention.ATTENTION
