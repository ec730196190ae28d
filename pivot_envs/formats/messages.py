"""The canonical chat form every format is read into: messages, tool calls, tool schemas, rewards.

The helpers here raise `MalformedRecord` naming the bad message or field; the format readers use
them and the reading loop turns the error into a ``file:line: reason`` entry of the report.
"""

from __future__ import annotations

import json
from typing import Any

from pivot_envs.chat import tool_call, tool_to_chat
from pivot_envs.formats.records import MalformedRecord

ROLES = ("system", "developer", "user", "assistant", "tool")


def content_text(content: Any, where: str) -> str | None:
    """Message content as text: strings as is, content parts joined."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, dict) and isinstance(part.get("refusal"), str):
                texts.append(part["refusal"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise MalformedRecord(
                    "unsupported content", f"{where}: content part of type {kind!r} has no text"
                )
        return "".join(texts)
    raise MalformedRecord(
        "wrong type", f"{where}: content must be a string or content parts, got {type(content).__name__}"
    )


def _arguments(arguments: Any, where: str) -> str:
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        return arguments
    if isinstance(arguments, (dict, list)):
        return json.dumps(arguments, ensure_ascii=False)
    raise MalformedRecord(
        "malformed tool call",
        f"{where}: arguments must be a JSON string or object, got {type(arguments).__name__}",
    )


def chat_tool_call(call: Any, where: str, default_id: str) -> dict:
    """A tool call in chat form from a chat `tool_calls` entry, a bare `{name, arguments}` or a Responses `function_call`."""
    if not isinstance(call, dict):
        raise MalformedRecord("malformed tool call", f"{where}: a tool call must be an object")
    function = call.get("function", call)
    if not isinstance(function, dict):
        raise MalformedRecord("malformed tool call", f"{where}: 'function' must be an object")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise MalformedRecord("malformed tool call", f"{where}: the tool call has no name")
    call_id = call.get("id") or call.get("call_id") or default_id
    return tool_call(name, _arguments(function.get("arguments"), where), str(call_id))


def normalize_messages(messages: Any, where: str = "messages") -> list[dict]:
    """Validate chat messages and bring them to the canonical form; raises MalformedRecord (a ValueError) naming the message.

    Keeps `role`, `content` (content parts joined to text), assistant `tool_calls` (ids filled in
    where missing, arguments as JSON strings; a legacy `function_call` becomes one tool call),
    `reasoning_content`, and a tool reply's `tool_call_id` and `name`.
    """
    if not isinstance(messages, list):
        raise MalformedRecord("wrong type", f"{where} must be a list, got {type(messages).__name__}")
    out = []
    for index, message in enumerate(messages):
        here = f"message {index}"
        if not isinstance(message, dict):
            raise MalformedRecord("wrong type", f"{here} must be an object, got {type(message).__name__}")
        role = message.get("role")
        if role == "function":  # the legacy name of a tool reply
            role = "tool"
        if role not in ROLES:
            raise MalformedRecord("unknown role", f"{here}: role {role!r} is not one of {', '.join(ROLES)}")
        clean: dict[str, Any] = {"role": role, "content": content_text(message.get("content"), here)}
        if role == "assistant":
            calls = message.get("tool_calls")
            if calls is None and isinstance(message.get("function_call"), dict):
                calls = [{"function": message["function_call"]}]
            if calls:
                if not isinstance(calls, list):
                    raise MalformedRecord("malformed tool call", f"{here}: tool_calls must be a list")
                clean["tool_calls"] = [
                    chat_tool_call(call, f"{here} tool call {j}", f"call_{index}_{j}")
                    for j, call in enumerate(calls)
                ]
            if isinstance(message.get("reasoning_content"), str):
                clean["reasoning_content"] = message["reasoning_content"]
        elif role == "tool":
            if not isinstance(clean["content"], str):
                clean["content"] = "" if clean["content"] is None else str(clean["content"])
            for key in ("tool_call_id", "name"):
                if message.get(key) is not None:
                    clean[key] = str(message[key])
        out.append(clean)
    return out


def chat_tools(tools: Any, where: str = "tools") -> list[dict]:
    """Tool schemas (chat or Responses form, a list or a JSON string of one) in chat form; None is no tools."""
    if tools is None:
        return []
    if isinstance(tools, str):  # ShareGPT and some exports store the schemas as a JSON string
        try:
            tools = json.loads(tools) if tools.strip() else []
        except json.JSONDecodeError as error:
            raise MalformedRecord("malformed tools", f"{where} is not valid JSON ({error.msg})") from None
    if not isinstance(tools, list):
        raise MalformedRecord("malformed tools", f"{where} must be a list, got {type(tools).__name__}")
    out = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise MalformedRecord("malformed tools", f"{where}[{index}] must be an object")
        chat = tool_to_chat(tool)
        if not isinstance(chat["function"].get("name"), str) or not chat["function"]["name"]:
            raise MalformedRecord("malformed tools", f"{where}[{index}] has no name")
        out.append(chat)
    return out


def source_reward(value: Any, where: str) -> float | None:
    """A recorded episode reward as a float (None when the source records none)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MalformedRecord("wrong type", f"{where}: reward must be a number, got {type(value).__name__}")
    return float(value)
