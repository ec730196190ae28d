"""OpenAI Responses API items <-> canonical chat messages, and the request parameters around them.

NeMo-Gym rollouts and pivot rows both carry a Responses API request (`responses_create_params`);
`nemo_gym_rollouts` and `nemo_gym_pivots` read it through here.
"""

from __future__ import annotations

import json
from typing import Any

from pivot_envs.formats.messages import ROLES, chat_tool_call, content_text
from pivot_envs.formats.records import MalformedRecord


def responses_to_messages(items: Any) -> list[dict]:
    """OpenAI Responses API items -> canonical chat messages.

    A model turn (optional `reasoning`, an assistant `message`, `function_call`s) becomes one
    assistant message: reasoning text goes to `reasoning_content`, consecutive function calls
    merge into `tool_calls` (`call_id` -> id); `function_call_output` becomes a `tool` message
    with `tool_call_id`. Items without a `type` but with a `role` are messages. Raises
    MalformedRecord (a ValueError) naming the item for an unsupported item type.
    """
    if not isinstance(items, list):
        raise MalformedRecord("wrong type", f"input must be a list of items, got {type(items).__name__}")
    messages: list[dict] = []
    turn: dict[str, Any] | None = None  # the assistant turn being assembled

    def close() -> None:
        nonlocal turn
        if turn is not None:
            messages.append(turn)
            turn = None

    def open_turn(fresh: bool) -> dict[str, Any]:
        # A message item starts a new turn unless the open one holds only reasoning.
        nonlocal turn
        if turn is not None and fresh and (turn["content"] is not None or turn.get("tool_calls")):
            close()
        if turn is None:
            turn = {"role": "assistant", "content": None}
        return turn

    for index, item in enumerate(items):
        here = f"item {index}"
        if not isinstance(item, dict):
            raise MalformedRecord("wrong type", f"{here} must be an object, got {type(item).__name__}")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ROLES or role == "tool":
                raise MalformedRecord(
                    "unknown role",
                    f"{here}: message role {role!r} is not system, developer, user or assistant",
                )
            text = content_text(item.get("content"), here)
            if role == "assistant":
                open_turn(fresh=True)["content"] = text
            else:
                close()
                messages.append({"role": role, "content": text})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            text = content_text(parts, here) or ""
            current = open_turn(fresh=True)
            previous = current.get("reasoning_content")
            current["reasoning_content"] = f"{previous}\n{text}" if previous else text
        elif kind == "function_call":
            current = open_turn(fresh=False)
            calls = current.setdefault("tool_calls", [])
            calls.append(chat_tool_call(item, here, f"call_{index}"))
        elif kind == "function_call_output":
            close()
            output = item.get("output")
            if not isinstance(output, str):
                output = (
                    content_text(output, here)
                    if isinstance(output, list)
                    else json.dumps(output, ensure_ascii=False)
                )
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise MalformedRecord("malformed tool output", f"{here}: function_call_output has no call_id")
            messages.append({"role": "tool", "content": output, "tool_call_id": call_id})
        else:
            raise MalformedRecord(
                "unsupported item", f"{here}: Responses item type {kind!r} is not supported"
            )
    close()
    return messages


def messages_to_responses(messages: list[dict]) -> list[dict]:
    """Canonical chat messages -> Responses API input items (the inverse of `responses_to_messages`)."""
    items: list[dict] = []
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            if message.get("reasoning_content"):
                items.append(
                    {
                        "type": "reasoning",
                        "summary": [{"type": "summary_text", "text": message["reasoning_content"]}],
                    }
                )
            if message.get("content") is not None:
                items.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": message["content"], "annotations": []}],
                    }
                )
            for call in message.get("tool_calls") or []:
                function = call["function"]
                items.append(
                    {
                        "type": "function_call",
                        "name": function["name"],
                        "arguments": function["arguments"],
                        "call_id": call["id"],
                    }
                )
        elif role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message.get("tool_call_id", ""),
                    "output": message.get("content") or "",
                }
            )
        else:
            items.append({"type": "message", "role": role, "content": message.get("content") or ""})
    return items


def request_params(record: dict) -> dict:
    """A NeMo-Gym record's `responses_create_params` (the Responses API request)."""
    params = record.get("responses_create_params")
    if not isinstance(params, dict):
        raise MalformedRecord("wrong type", "responses_create_params must be an object")
    return params


def extra_params(params: dict) -> dict:
    """Request parameters worth keeping (set ones), without the input and tools we convert."""
    return {k: v for k, v in params.items() if k not in ("input", "tools") and v is not None}


def responses_input(params: dict) -> list:
    """The request's input items; a bare string is one user message."""
    items = params.get("input", [])
    if isinstance(items, str):  # the Responses API accepts a bare user string as input
        items = [{"type": "message", "role": "user", "content": items}]
    return items
