"""TRL adapter: pivots as a Dataset and envs as reward_funcs, driven by the real trl.GRPOTrainer."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from echo_domain import EchoEnv, real_pivots  # noqa: E402  (the core tests' env over real NeMo-Gym pivot rows)
from toys import HasLetterVerifier  # noqa: E402
from trl_cpu import cpu_grpo_trainer  # noqa: E402

from pivot_envs.adapters.trl import reward_function, to_dataset  # noqa: E402
from pivot_envs.env import InfrastructureError  # noqa: E402


def letter_env():
    return EchoEnv(real_pivots(), verifier=HasLetterVerifier())


class BrokenBackendEnv(EchoEnv):
    def execute(self, pivot, action):
        if pivot.id.endswith("/2"):
            raise InfrastructureError("tool backend down")
        return super().execute(pivot, action)


def test_dataset_rows_hold_the_conversational_prompt_tools_and_pivot_id():
    pivots = real_pivots()
    dataset = to_dataset(pivots)
    assert len(dataset) == len(pivots)
    row = dataset[0]
    assert row["pivot_id"] == pivots[0].id
    assert row["prompt"][0]["role"] == "system" and "<tools>" in row["prompt"][0]["content"]
    assert row["prompt"][-1] == {"role": "user", "content": pivots[0].messages[-1]["content"]}
    assert json.loads(row["tools"]) == pivots[0].tools


def test_dataset_with_a_tokenizer_holds_the_rendered_prompt():
    from transformers import AutoTokenizer

    from pivot_envs.adapters import smollm2
    from pivot_envs.adapters.chat_template import render_prompt

    tokenizer = AutoTokenizer.from_pretrained(smollm2.checkpoint())
    pivot = real_pivots()[1]
    assert to_dataset([pivot], tokenizer=tokenizer)[0]["prompt"] == render_prompt(
        tokenizer, pivot.messages, pivot.tools
    )


def test_reward_function_scores_each_completion_at_its_rows_pivot():
    pivots = real_pivots()
    reward = reward_function(lambda: EchoEnv(pivots))  # strict verifier: only the expert's action scores 1
    answer = pivots[4].expert["content"]
    got = reward(
        prompts=[None] * 3,
        completions=[[{"role": "assistant", "content": answer}], "something else", answer],
        pivot_id=[pivots[4].id, pivots[4].id, pivots[0].id],
    )
    assert got == [1.0, 0.0, 0.0]


def tool_parsing_tokenizer():
    """SmolLM2's tokenizer with a chat template TRL parses tool calls out of (`add_response_schema`).

    TRL parses responses only for the chat templates it knows. Qwen3's is ChatML with Hermes
    `<tool_call>` blocks, the format SmolLM2 is prompted to write, so SmolLM2 gets Qwen3's template.
    """
    from transformers import AutoTokenizer
    from trl.chat_template_utils import add_response_schema, qwen3_chat_template

    from pivot_envs.adapters import smollm2

    tokenizer = AutoTokenizer.from_pretrained(smollm2.checkpoint())
    tokenizer.chat_template = qwen3_chat_template
    return add_response_schema(tokenizer)


def hermes_text(message):
    """An assistant message as the model writes it: text with Hermes `<tool_call>` blocks."""
    from pivot_envs.adapters.chat_template import prompt_messages

    return prompt_messages([message], [])[0]["content"]


def test_a_tool_call_trl_parsed_out_of_the_text_is_stepped_as_the_message():
    pivots = real_pivots()
    pivot = pivots[3]  # the expert calls get_weather(city="Paris")

    def parsed(
        city,
    ):  # a completion as TRL's parse_response gives it: the call out of the text, arguments a dict
        return [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}
                ],
            }
        ]

    reward = reward_function(lambda: EchoEnv(pivots))  # strict verifier: only the expert's call scores 1
    assert reward(completions=[parsed("Paris"), parsed("Rome")], pivot_id=[pivot.id, pivot.id]) == [1.0, 0.0]


def test_a_completion_that_is_neither_text_nor_messages_is_refused_naming_its_type():
    from pivot_envs.adapters.trl import TRLInputError

    reward = reward_function(lambda: EchoEnv(real_pivots()))
    with pytest.raises(TRLInputError, match="a completion must be text or a list of messages, got int"):
        reward(completions=[7], pivot_id=[real_pivots()[0].id])


def test_infrastructure_failures_are_none_so_trl_masks_them():
    pivots = real_pivots()
    reward = reward_function(lambda: BrokenBackendEnv(pivots))
    assert reward(completions=["x", "x"], pivot_id=[pivots[0].id, pivots[1].id]) == [0.0, None]


@pytest.mark.slow
def test_trl_grpo_trainer_logs_the_rewards_the_env_gives(tmp_path):
    from pivot_envs.adapters import smollm2

    torch.set_num_threads(2)
    model, tokenizer = smollm2.load()
    pivots = real_pivots()[:4]
    env_reward = reward_function(letter_env, num_envs=2)
    seen: list[tuple[list, list]] = []

    def pivot_reward(completions, pivot_id, **kwargs):
        seen.append((list(completions), list(pivot_id)))
        return env_reward(completions=completions, pivot_id=pivot_id, **kwargs)

    trainer = cpu_grpo_trainer(
        model,
        tokenizer,
        pivot_reward,
        pivots,
        tmp_path,
        per_device_train_batch_size=4,
        max_completion_length=16,
    )
    trainer.train()

    logged = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    assert len(seen) == 2 and len(logged) == 2
    fresh = letter_env()
    for (completions, ids), reward in zip(seen, logged):
        rescored = []
        for completion, pid in zip(completions, ids):
            fresh.reset(options={"pivot": pid})
            rescored.append(fresh.step(completion[0]["content"])[1])
        assert reward == pytest.approx(sum(rescored) / len(rescored))
        assert set(ids) <= {p.id for p in pivots}


@pytest.mark.slow
def test_trl_grpo_trainer_hands_the_env_the_tool_calls_its_chat_template_parsed(tmp_path):
    from pivot_envs.adapters import smollm2

    torch.set_num_threads(2)
    model, _ = smollm2.load()
    tokenizer = tool_parsing_tokenizer()
    pivot = real_pivots()[3]
    call = tokenizer(hermes_text(pivot.expert) + "<|im_end|>", add_special_tokens=False)["input_ids"]
    # The model is steered to write the expert's call: each token of it is biased given the ones before
    # (the longest match wins), so the test knows the completion TRL generates and then parses.
    steer = {tuple(call[:k]): 100.0 * k for k in range(1, len(call) + 1)}
    env_reward = reward_function(lambda: EchoEnv([pivot]), num_envs=1)
    seen: list = []

    def pivot_reward(completions, pivot_id, **kwargs):
        seen.extend(completions)
        return env_reward(completions=completions, pivot_id=pivot_id, **kwargs)

    trainer = cpu_grpo_trainer(
        model,
        tokenizer,
        pivot_reward,
        [pivot],
        tmp_path,
        max_steps=1,
        max_completion_length=len(call) + 4,
        generation_kwargs={"sequence_bias": steer},
    )
    trainer.train()

    assert [c[0]["tool_calls"][0]["function"] for c in seen] == [
        {"name": "get_weather", "arguments": {"city": "Paris"}}
    ] * 2
    assert all(
        c[0]["content"] == "" for c in seen
    )  # the call is not in the text: stepping the text would score 0
    assert [entry["reward"] for entry in trainer.state.log_history if "reward" in entry] == [1.0]


def test_reward_function_by_env_id_scores_with_the_registered_tool_use_domain():
    import gymnasium as gym

    import pivot_envs
    from pivot_envs.adapters.chat_template import prompt_messages

    gym.register_envs(pivot_envs)
    pivots = [p for p in gym.make("pivot/tool-use-v0").unwrapped.pivots if p.expert.get("tool_calls")][:3]
    reward = reward_function("pivot/tool-use-v0", pivots=pivots, num_envs=2)
    # the expert's turn written the way the model writes it: Hermes <tool_call> blocks
    expert_texts = [prompt_messages([p.expert], [])[0]["content"] for p in pivots]
    got = reward(
        completions=[[{"role": "assistant", "content": t}] for t in expert_texts] + ["no tool call"],
        pivot_id=[p.id for p in pivots] + [pivots[0].id],
    )
    assert got == [1.0, 1.0, 1.0, 0.0]
