"""The `sharegpt` format: ``{"conversations": [{"from", "value"}], "system"?, "tools"?}``, with
`function_call` and `observation` turns for tool use (tools as a list or a JSON string).
"""

from __future__ import annotations

import json

from pivot_envs.formats.messages import chat_tool_call, chat_tools, source_reward
from pivot_envs.formats.records import MalformedRecord
from pivot_envs.trajectory import Trajectory

# ShareGPT's `from` values -> chat roles (a `function_call` turn becomes an assistant turn with calls).
_SPEAKERS = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "function_call": "function_call",
    "observation": "tool",
    "tool": "tool",
    "function": "tool",
}


def read_sharegpt(record: dict, default_id: str) -> Trajectory:
    """A ShareGPT record -> Trajectory (id: the record's `id`, else `default_id`); raises MalformedRecord.

    A `function_call` value (`{"name", "arguments"}` or a list of them) is one assistant turn; each
    `observation` answers the next pending call.
    """
    turns = record.get("conversations")
    if not isinstance(turns, list):
        raise MalformedRecord("wrong type", f"conversations must be a list, got {type(turns).__name__}")
    messages: list[dict] = []
    if isinstance(record.get("system"), str) and record["system"]:
        messages.append({"role": "system", "content": record["system"]})
    pending: list[str] = []  # call ids awaiting an observation, in order
    for index, turn in enumerate(turns):
        here = f"conversations[{index}]"
        if not isinstance(turn, dict):
            raise MalformedRecord("wrong type", f"{here} must be an object")
        speaker = turn.get("from", turn.get("role"))
        role = _SPEAKERS.get(speaker) if isinstance(speaker, str) else None
        value = turn.get("value", turn.get("content"))
        if role is None:
            raise MalformedRecord("unknown role", f"{here}: 'from' is {speaker!r}")
        if role == "function_call":
            try:
                parsed = json.loads(value) if isinstance(value, str) else value
            except json.JSONDecodeError as error:
                raise MalformedRecord(
                    "malformed tool call", f"{here}: the function call is not JSON ({error.msg})"
                ) from None
            calls = parsed if isinstance(parsed, list) else [parsed]
            tool_calls = [
                chat_tool_call(call, f"{here} call {j}", f"call_{index}_{j}") for j, call in enumerate(calls)
            ]
            messages.append({"role": "assistant", "content": None, "tool_calls": tool_calls})
            pending = [call["id"] for call in tool_calls]
        elif role == "tool":
            message = {
                "role": "tool",
                "content": value if isinstance(value, str) else json.dumps(value, ensure_ascii=False),
            }
            if pending:
                message["tool_call_id"] = pending.pop(0)
            messages.append(message)
        else:
            if not isinstance(value, str):
                raise MalformedRecord(
                    "wrong type", f"{here}: value must be a string, got {type(value).__name__}"
                )
            messages.append({"role": role, "content": value})
            pending = []
    skip = {"conversations", "tools", "reward", "id", "system"}
    return Trajectory(
        id=str(record.get("id") or default_id),
        messages=messages,
        tools=chat_tools(record.get("tools")),
        reward=source_reward(record.get("reward"), "reward"),
        context={k: v for k, v in record.items() if k not in skip},
        format="sharegpt",
    )
