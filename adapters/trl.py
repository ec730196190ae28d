"""TRL adapter: pivots as a `datasets.Dataset`, pivot envs as `reward_funcs` for `trl.GRPOTrainer`.

    from trl import GRPOConfig, GRPOTrainer
    from pivot_envs.adapters.trl import to_dataset, reward_function

    dataset = to_dataset(pivots)                                  # prompt, tools, pivot_id
    reward = reward_function("pivot/tool-use-v0", pivots=pivots)  # steps the env at each row's pivot
    GRPOTrainer(model, reward_funcs=reward, train_dataset=dataset, args=GRPOConfig(...)).train()

Users who outgrow one machine train with TRL + accelerate (DeepSpeed, FSDP) on the same envs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from pivot_envs.errors import PivotEnvsError
from pivot_envs.pivot import Pivot
from pivot_envs.scoring import EnvPool, resolve_env


class TRLInputError(PivotEnvsError, ValueError):
    """What TRL handed the adapter (or the adapter was handed for TRL) is not what it can use."""


def to_dataset(pivots: Sequence[Pivot], tokenizer: Any = None) -> Any:
    """A `datasets.Dataset` with one row per pivot: `prompt`, `tools` (JSON), `pivot_id`, `domain`.

    Without a tokenizer `prompt` is conversational: the pivot's messages normalised to plain
    {role, content} turns with the tools described Hermes-style in the system prompt
    (`chat_template.prompt_messages`), because TRL renders one trainer-wide tool list, not one per
    row. With a tokenizer `prompt` is the rendered prompt text (`chat_template.render_prompt`),
    the exact prompt the bundled trainer and the hf policy use.
    """
    from datasets import Dataset
    from pivot_envs.adapters.chat_template import prompt_messages, render_prompt

    if not pivots:
        raise TRLInputError("to_dataset: no pivots")
    rows = []
    for pivot in pivots:
        if tokenizer is not None:
            prompt: Any = render_prompt(tokenizer, pivot.messages, pivot.tools)
        else:
            prompt = prompt_messages(pivot.messages, pivot.tools)
        rows.append({"prompt": prompt, "tools": json.dumps(pivot.tools), "pivot_id": pivot.id, "domain": pivot.domain})
    return Dataset.from_list(rows)


def _completion_action(completion: Any) -> str | dict[str, Any]:
    """The action a TRL completion holds: its text, or its assistant message when that carries tool calls.

    Conversational completions are lists of messages. When the tokenizer parses responses (a
    `response_template`, transformers >= 5), TRL moves a tool call out of the text into the
    message's `tool_calls` and leaves the content empty: such a message is the action, as an
    OpenAI-compatible server's would be. Only the first assistant message is the pivot's turn.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        turns = [m for m in completion if isinstance(m, dict) and m.get("role", "assistant") == "assistant"]
        if not turns:
            return ""
        if turns[0].get("tool_calls"):
            return {**turns[0], "role": "assistant"}
        return str(turns[0].get("content") or "")
    raise TRLInputError(f"pivot reward: a completion must be text or a list of messages, got {type(completion).__name__}")


def reward_function(env_id: str | Callable[[], Any], num_envs: int = 4, **env_kwargs: Any) -> Callable[..., list[float | None]]:
    """A TRL reward function that steps the env at each row's pivot with each completion.

    TRL calls it as `f(prompts=..., completions=..., completion_ids=..., pivot_id=[...], ...)`
    (dataset columns arrive as keyword lists). A completion is stepped as its text, or as its
    assistant message when TRL parsed tool calls into it. It returns the env's reward (the functional
    verifier), or None for a sample whose infrastructure failed (`info["valid"] == False`): TRL
    leaves such samples out of the group's baseline instead of scoring them 0.
    `env_id` is an env id built with `env_kwargs` (which must hold the pivots unless the domain's
    bundled ones are meant), or a factory of envs.
    """
    pivots = list(env_kwargs.pop("pivots", None) or [])
    make_env = resolve_env(env_id, pivots, **env_kwargs)
    pool: EnvPool | None = None

    def pivot_reward(completions: Sequence[Any], pivot_id: Sequence[str], **_: Any) -> list[float | None]:
        nonlocal pool
        if len(completions) != len(pivot_id):
            raise TRLInputError(f"pivot reward: {len(completions)} completions but {len(pivot_id)} pivot ids")
        if pool is None:
            pool = EnvPool(make_env, num_envs)
        scores = pool.score([(pid, _completion_action(c)) for pid, c in zip(pivot_id, completions)])
        return [score.reward if score.valid else None for score in scores]

    return pivot_reward
