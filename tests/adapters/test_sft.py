"""The SFT warm-up: expert turns encoded as the policy would generate them, the action's
log-likelihood with and without the prompt's gradient, and a warm-up that fits its examples."""

from __future__ import annotations

import gymnasium as gym
import pytest

torch = pytest.importorskip("torch")

from pivot_envs.adapters.grpo import sequence_logprobs  # noqa: E402
from pivot_envs.adapters.sft import SFTConfig, common_prefix_length, expert_examples, turn_logprobs, warm_up  # noqa: E402


@pytest.fixture(scope="module")
def pivots():
    env = gym.make("pivot/tool-use-v0")
    try:
        every = env.unwrapped.pivots
        calls = [p for p in every if p.expert.get("tool_calls")][:2]
        messages = [p for p in every if not p.expert.get("tool_calls")][:1]
        return calls + messages
    finally:
        env.close()


@pytest.fixture(scope="module")
def policy():
    from pivot_envs.policy import load_policy

    torch.set_num_threads(1)  # the test machine's cores are shared: one thread is much faster there
    return load_policy("hf:smollm2", device="cpu", max_prompt_tokens=256)


def test_the_expert_turn_decodes_to_an_action_the_env_scores_one(policy, pivots):
    env = gym.make("pivot/tool-use-v0", pivots=pivots)
    try:
        for (_, action), pivot in zip(expert_examples(policy, pivots), pivots):
            assert action[-1] in policy._stop_ids()  # the turn ends as a generated one would
            env.reset(options={"pivot": pivot.id})
            text = policy.tokenizer.decode(action, skip_special_tokens=True)
            _, reward, _, _, info = env.step(text)
            assert reward == 1.0, (pivot.id, text, info)
    finally:
        env.close()


def test_turn_logprobs_equal_the_full_sequences_with_or_without_the_prompts_gradient(policy, pivots):
    examples = expert_examples(policy, pivots)
    for detach in (False, True):
        logprobs, mask = turn_logprobs(policy.model, examples, detach_prefix=detach)
        for (prompt, action), row, row_mask in zip(examples, logprobs, mask):
            reference, _ = sequence_logprobs(policy.model, prompt, [action])
            assert row_mask.sum() == len(action)
            torch.testing.assert_close(row[row_mask], reference[0, : len(action)], atol=1e-4, rtol=0)


def test_the_prompts_common_head_runs_once_and_changes_no_value(policy, pivots):
    examples = expert_examples(policy, pivots)
    shared = common_prefix_length([prompt[:-1] for prompt, _ in examples])
    assert shared > 50  # the system prompt's start is shared
    seen = []  # the prompt tokens each forward pass without gradient gets
    hook = policy.model.register_forward_pre_hook(
        lambda module, args, kwargs: (
            seen.append(kwargs["input_ids"].numel()) if not torch.is_grad_enabled() else None
        ),
        with_kwargs=True,
    )
    try:
        turn_logprobs(policy.model, examples, detach_prefix=True)
    finally:
        hook.remove()
    longest_tail = max(len(prompt) - 1 - shared for prompt, _ in examples)
    assert seen == [shared, len(examples) * longest_tail]  # the head once, then the right-padded tails
    one = examples[0]
    # a batch of one (all of the prompt is the head) and a batch of one prompt twice (no tails)
    for batch in ([one], [one, (one[0], one[1][:3])]):
        logprobs, mask = turn_logprobs(policy.model, batch, detach_prefix=True)
        reference, _ = sequence_logprobs(policy.model, one[0], [one[1]])
        for row, row_mask in zip(logprobs, mask):
            torch.testing.assert_close(row[row_mask], reference[0, : int(row_mask.sum())], atol=1e-4, rtol=0)


def test_common_prefix_length():
    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_length([[1, 2], [1, 2]]) == 2
    assert common_prefix_length([[5], [1, 2]]) == 0
    assert common_prefix_length([[], [1]]) == 0


def test_the_detached_prompt_keeps_most_of_the_gradient(policy, pivots):
    examples = expert_examples(policy, pivots)
    grads = []
    for detach in (False, True):
        policy.model.zero_grad(set_to_none=True)
        logprobs, mask = turn_logprobs(policy.model, examples, detach_prefix=detach)
        (-(logprobs * mask).sum() / mask.sum()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in policy.model.parameters() if p.grad is not None]))
    policy.model.zero_grad(set_to_none=True)
    exact, detached = grads
    assert exact.shape == detached.shape  # every parameter gets a gradient either way
    assert torch.nn.functional.cosine_similarity(exact, detached, dim=0) > 0.5
    assert not torch.allclose(exact, detached)  # it is an approximation: the prompt's path is left out


def test_the_warm_up_fits_its_examples_and_records_each_step(policy, pivots, tmp_path):
    examples = expert_examples(policy, pivots)

    def nll() -> float:
        with torch.no_grad():
            logprobs, mask = turn_logprobs(policy.model, examples)
            return float(-(logprobs * mask).sum() / mask.sum())

    before = nll()
    metrics = tmp_path / "sft.jsonl"
    records = warm_up(
        policy,
        pivots,
        SFTConfig(epochs=3, batch_size=2, learning_rate=1e-4, metrics=str(metrics), progress=False),
    )
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6] and [r["epoch"] for r in records] == [
        0,
        0,
        1,
        1,
        2,
        2,
    ]
    assert len(metrics.read_text().splitlines()) == 6
    assert nll() < 0.7 * before


def test_the_warm_up_needs_a_trainable_model(pivots):
    class Remote:
        name = "openai:http://example#m"

    with pytest.raises(ValueError, match="no trainable model"):
        warm_up(Remote(), pivots)


def test_sft_stops_at_max_steps_and_calls_back_after_each_step(policy, pivots):
    calls = []
    records = warm_up(
        policy,
        pivots,
        SFTConfig(epochs=3, batch_size=2, max_steps=3, progress=False),
        on_step=lambda step, last: calls.append((step, last)),
    )
    assert [r["step"] for r in records] == [1, 2, 3]  # 2 steps an epoch: the second epoch's second ends it
    assert [r["epoch"] for r in records] == [0, 0, 1]
    assert calls == [(1, False), (2, False), (3, True)]
