"""Reading the one tool call out of a coding agent's turn, in the canonical form.

Canonical form (what the strict verifier compares, for the expert and for parsed actions alike):
an assistant message with no text and exactly one tool call, its name the harness's
(`execute_bash` -> `bash`, `finish` -> `submit`, see tools.ALIASES) and its arguments JSON text.

Accepted inputs: a message dict with `tool_calls` (arguments as JSON text or an object), a
Responses API `function_call` item, or text holding Hermes `<tool_call>{"name", "arguments"}</tool_call>`
blocks (reasoning in `<think>...</think>` is dropped) or a bare JSON call. Arguments that are not
valid JSON are kept as their text: the call then runs and the tool answers "invalid_arguments",
as a harness would. Anything else has no call: "no_tool_call" (text only), "multiple_calls",
"unparseable" (a block that is not JSON, a call without a name).

`text_beside` is what a turn says beside its call (prose around the block, a message's content): not
part of the canonical form, it is handed to the verifier apart (`call_text`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from pivot_envs.chat import assistant_message, text_of, tool_call
from pivot_envs.env import ParsedAction

from .tools import canonical_name

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_THINK = re.compile(r"<think>.*?</think>", re.S)


def canonical_call(name: str, arguments: Any) -> dict[str, Any]:
    """The canonical assistant message of one call (`arguments`: an object, or text kept as it is)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            pass  # kept as text: the tool reports invalid_arguments
    call = tool_call(canonical_name(name.strip()), arguments, "call_0")
    return assistant_message(None, [call])


def call_of(message: dict[str, Any]) -> tuple[str, Any]:
    """The (name, arguments) of a canonical message's one call, arguments decoded where they are JSON."""
    function = message["tool_calls"][0]["function"]
    arguments = function.get("arguments")
    try:
        return function["name"], json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        return function["name"], arguments


def parse_action(action: Any) -> ParsedAction:
    """Parse raw completion text or a message dict into the canonical form; never raises."""
    try:
        calls = _calls(action)
    except ValueError as error:
        return ParsedAction(None, "unparseable", str(error))
    if not calls:
        return ParsedAction(
            None, "no_tool_call", "the turn calls no tool: call bash, str_replace_editor or submit"
        )
    if len(calls) > 1:
        return ParsedAction(
            None, "multiple_calls", f"{len(calls)} tool calls; the action must be exactly one call"
        )
    name, arguments = calls[0]
    if not isinstance(name, str) or not name.strip():
        return ParsedAction(None, "unparseable", "the tool call has no name")
    if not (arguments is None or isinstance(arguments, (str, dict))):
        return ParsedAction(None, "unparseable", f"tool {name!r}: arguments must be a JSON object")
    try:
        return ParsedAction(canonical_call(name, arguments if arguments is not None else {}))
    except (TypeError, ValueError) as error:  # a value json cannot write (a lone surrogate stays: it is text)
        return ParsedAction(
            None, "unparseable", f"tool {name!r}: arguments cannot be written as JSON: {error}"
        )


def _calls(action: Any) -> list[tuple[Any, Any]]:
    if isinstance(action, dict):
        if action.get("type") == "function_call":
            return [(action.get("name"), action.get("arguments"))]
        raw = action.get("tool_calls")
        if raw:
            if not isinstance(raw, list):
                raise ValueError(f"tool_calls must be a list, got {type(raw).__name__}")
            return [_name_and_arguments(call, index) for index, call in enumerate(raw)]
        content = action.get("content")
        if isinstance(content, list):
            content = "".join(
                p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
        return _calls_in_text(content) if isinstance(content, str) else []
    if isinstance(action, str):
        return _calls_in_text(action)
    raise ValueError(f"an action must be text or a message dict, got {type(action).__name__}")


def text_beside(action: Any) -> str:
    """What an action says beside its call, which the canonical form drops and the effect verifier bounds
    (`call_text`): a message's content beside its tool calls, or the completion text outside its
    `<tool_call>` blocks; reasoning in `<think>...</think>` (or all before a lone `</think>`) is not
    counted, as the parser drops it. "" for a bare JSON call, a Responses API `function_call` item or an
    action of no text."""
    if isinstance(action, dict):
        if action.get("type") == "function_call":
            return ""
        content = text_of(action)
        if action.get("tool_calls"):
            return _without_think(content).strip()
        action = content
    if not isinstance(action, str):
        return ""
    text = _without_think(action)
    if not _BLOCK.search(text) and text.strip().startswith("{"):
        return ""  # a bare JSON call (or prose starting with a brace, which calls nothing)
    return _BLOCK.sub("", text).strip()


def _without_think(text: str) -> str:
    text = _THINK.sub("", text)
    return text.rsplit("</think>", 1)[1] if "</think>" in text else text


def _name_and_arguments(call: Any, index: int) -> tuple[Any, Any]:
    function = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise ValueError(f"tool call {index} is not an object with a 'function' object")
    arguments = function["arguments"] if "arguments" in function else function.get("parameters")
    return function.get("name"), arguments


def _calls_in_text(text: str) -> list[tuple[Any, Any]]:
    text = _without_think(text)
    blocks = _BLOCK.findall(text)
    stripped = text.strip()
    if not blocks and stripped.startswith("{"):
        blocks = [stripped]
    calls = []
    for index, block in enumerate(blocks):
        try:
            value = json.loads(block)
        except json.JSONDecodeError:
            if stripped.startswith("{") and "<tool_call>" not in text:
                return []  # prose that happens to start with a brace
            raise ValueError(f"tool call block {index} is not valid JSON: {block[:80]!r}") from None
        items = value if isinstance(value, list) else [value]
        calls += [_name_and_arguments(item, index) for item in items]
    return calls
