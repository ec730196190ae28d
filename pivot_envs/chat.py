"""The canonical chat form: OpenAI Chat Completions messages and function tool schemas.

Messages are dicts with `role`, `content`, and for assistant turns optionally `tool_calls`
(`[{id, type: "function", function: {name, arguments: JSON string}}]`) and
`reasoning_content`; tool replies carry `tool_call_id`. transformers' chat templates, vLLM,
TRL and OpenAI-compatible servers all speak this form.
"""

from __future__ import annotations

import json
from typing import Any


def tool_to_chat(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool schema in chat form ({"type": "function", "function": {...}}), from either form."""
    if isinstance(tool.get("function"), dict):
        return {"type": "function", "function": dict(tool["function"])}
    function = {"name": tool.get("name", "")}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
    if "strict" in tool:
        function["strict"] = tool["strict"]
    return {"type": "function", "function": function}


def tool_to_responses(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool schema in Responses API form ({"type": "function", "name", "parameters", ...})."""
    if not isinstance(tool.get("function"), dict):
        return dict(tool)
    function = tool["function"]
    out = {"type": "function", "name": function.get("name", "")}
    if function.get("description") is not None:
        out["description"] = function["description"]
    out["parameters"] = function.get("parameters") or {"type": "object", "properties": {}}
    if "strict" in function:
        out["strict"] = function["strict"]
    return out


def tool_name(tool: dict[str, Any]) -> str:
    """The name of a tool schema in either form."""
    function = tool.get("function")
    return str(function.get("name", "")) if isinstance(function, dict) else str(tool.get("name", ""))


def tool_parameters(tool: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema of a tool's parameters, in either form."""
    function = tool.get("function")
    source = function if isinstance(function, dict) else tool
    params = source.get("parameters")
    return params if isinstance(params, dict) else {}


def tool_call(name: str, arguments: Any, call_id: str) -> dict[str, Any]:
    """One chat-form tool call; `arguments` (a dict or a JSON string) is stored as a JSON string."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant_message(
    content: str | None = None, tool_calls: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """An assistant message in canonical form."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def parse_arguments(arguments: Any) -> tuple[Any, bool]:
    """A tool call's arguments as a Python value, and whether they were valid JSON."""
    if isinstance(arguments, (dict, list)):
        return arguments, True
    if arguments is None or arguments == "":
        return {}, True
    if not isinstance(arguments, str):
        return arguments, False
    try:
        return json.loads(arguments), True
    except json.JSONDecodeError:
        return arguments, False


def calls_of(message: dict[str, Any]) -> list[tuple[str, Any]]:
    """The (name, parsed arguments) of every tool call in an assistant message, in order."""
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", call) if isinstance(call, dict) else {}
        name = str(function.get("name", "")) if isinstance(function, dict) else ""
        arguments, _ = parse_arguments(function.get("arguments") if isinstance(function, dict) else None)
        calls.append((name, arguments))
    return calls


def text_of(message: dict[str, Any]) -> str:
    """An assistant message's text content, trimmed ("" when there is none)."""
    content = message.get("content")
    if isinstance(content, list):  # content parts
        content = "".join(
            part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return content.strip() if isinstance(content, str) else ""


def canonical_action(message: dict[str, Any]) -> str:
    """The canonical form the strict verifier compares (paper Eq. 2).

    Tool names and arguments as parsed JSON (so key order and whitespace in the JSON string do
    not matter, but everything else does), plus the trimmed message text.
    """
    return json.dumps(
        {"content": text_of(message), "calls": calls_of(message)}, sort_keys=True, ensure_ascii=False
    )
