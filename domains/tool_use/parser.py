"""Parse a model's assistant turn (raw text or a message dict) into the canonical chat form.

Accepted raw text:
- Hermes-style blocks `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one or several;
  a block may hold a JSON list of calls (SmolLM2 writes them so); a last block left unclosed
  (generation stopped at the closing tag) is accepted when its JSON is complete;
- `<think>...</think>` reasoning, removed (also a lone `</think>` whose opening tag was in the
  prompt);
- a bare JSON tool call (or list of calls), optionally in a ```json fence;
- anything else is a plain message.
Accepted dicts: an assistant message with `content` and/or `tool_calls` (arguments as a JSON
string, as OpenAI-compatible servers return them, or as an object).

A call is `{"name": str, "arguments": object}` (`parameters` is read as `arguments`; arguments
given as a JSON string are decoded). Empty output, malformed JSON in a tool-call block, a call
without a name or with non-object arguments are `unparseable`. Call ids are deterministic:
`call_<index>_<crc32 of name and arguments>`.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from pivot_envs.env import ParsedAction

OPEN, CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_loads = json.JSONDecoder().decode  # json.loads without its checks for bytes and a BOM (text only here)
_encode = json.JSONEncoder(ensure_ascii=False).encode
# Arguments this parser decoded, by the identity of the JSON string it wrote into the canonical
# message: execution and verification of the same action read them back instead of decoding the
# string again. Keyed by identity (the entry holds the string, so its id cannot be reused while
# it is stored), never by content; emptied by each parse_action, and bounded.
_DECODED: dict[int, tuple[str, Any]] = {}
_DECODED_MAX = 1024


class _Unparseable(ValueError):
    pass


def call_id(index: int, name: str, arguments: str) -> str:
    """The deterministic id of the index-th call of a turn."""
    return f"call_{index}_{zlib.crc32(f'{name}:{arguments}'.encode()):08x}"


def _canonical_call(raw: Any, index: int) -> dict[str, Any]:
    """One call object (`{"name", "arguments"}` or OpenAI `{"function": {...}}`) in chat form."""
    if not isinstance(raw, dict):
        raise _Unparseable(f"tool call {index} is a {type(raw).__name__}, not an object")
    function = raw.get("function")
    if isinstance(function, dict):
        raw = function
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise _Unparseable(f"tool call {index} has no name")
    arguments = raw["arguments"] if "arguments" in raw else raw.get("parameters")
    if arguments is None or arguments == "":
        arguments = {}
    if isinstance(arguments, str):
        try:
            arguments = _loads(arguments)
        except ValueError:
            raise _Unparseable(f"tool call {index} ({name}): arguments are not valid JSON") from None
    if not isinstance(arguments, dict):
        raise _Unparseable(f"tool call {index} ({name}): arguments must be a JSON object")
    name = name.strip()
    try:
        text = _encode(arguments)
    except (TypeError, ValueError) as error:  # a set, bytes, a cycle, an int past Python's digit limit
        why = f"{type(error).__name__}: {error}"[:200]
        raise _Unparseable(f"tool call {index} ({name!r}): its arguments are not JSON ({why})") from None
    try:
        identifier = call_id(index, name, text)  # encodes name and arguments as UTF-8
    except UnicodeEncodeError:  # a lone surrogate: not text, so no tool could receive it
        raise _Unparseable(
            f"tool call {index} ({name!r}): its name or arguments are not valid Unicode text"
        ) from None
    if len(_DECODED) >= _DECODED_MAX:
        _DECODED.clear()
    _DECODED[id(text)] = (text, arguments)
    return {"id": identifier, "type": "function", "function": {"name": name, "arguments": text}}


def arguments_of(call: dict[str, Any]) -> tuple[Any, bool]:
    """A chat-form tool call's arguments decoded, and whether they were valid JSON.

    Read-only: the value may be shared with other readers of the same action.
    """
    function = call.get("function", call) if isinstance(call, dict) else {}
    text = function.get("arguments") if isinstance(function, dict) else None
    if isinstance(text, str):
        entry = _DECODED.get(id(text))
        if entry is not None and entry[0] is text:
            return entry[1], True
        if not text.strip():
            return {}, True
        try:
            return _loads(text), True
        except ValueError:
            return text, False
    return ({} if text is None else text), True


def canonical_arguments(call: Any) -> str:
    """A call's arguments as the JSON text the parser writes into a canonical message."""
    arguments, valid = arguments_of(call if isinstance(call, dict) else {})
    return _encode(arguments) if valid else str(arguments)


def _calls_from_json(value: Any, start: int) -> list[dict[str, Any]]:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise _Unparseable("empty list of tool calls")
    return [_canonical_call(item, start + i) for i, item in enumerate(items)]


def strip_think(text: str) -> str:
    """The text without its reasoning: `<think>...</think>` blocks, or all before a lone `</think>`."""
    if THINK_CLOSE not in text:
        # An unclosed <think> means the model never finished reasoning: nothing after it is an action.
        start = text.find(THINK_OPEN)
        return text if start < 0 else text[:start]
    out = []
    position = 0
    while True:
        close = text.find(THINK_CLOSE, position)
        if close < 0:
            out.append(text[position:])
            break
        opening = text.find(THINK_OPEN, position, close)
        out.append(text[position:opening] if opening >= 0 else "")
        position = close + len(THINK_CLOSE)
    return "".join(out)


def _fenced_json(text: str) -> str:
    if text.startswith("```"):
        body = text[3:]
        if body.startswith("json"):
            body = body[4:]
        if body.rstrip().endswith("```"):
            return body.rstrip()[:-3].strip()
    return text


def _looks_like_call(value: Any) -> bool:
    items = value if isinstance(value, list) else [value]
    return bool(items) and all(
        isinstance(item, dict) and ("name" in item or isinstance(item.get("function"), dict))
        for item in items
    )


def parse_text(text: str) -> dict[str, Any]:
    """A completion text as a canonical assistant message (raises _Unparseable)."""
    if "think>" in text:
        text = strip_think(text)
    if OPEN not in text:
        stripped = text.strip()
        if not stripped:
            raise _Unparseable("empty completion")
        if stripped[0] in "[{`":
            candidate = _fenced_json(stripped)
            try:
                value = _loads(candidate)
            except ValueError:
                value = None
            if value is not None and _looks_like_call(value):
                return {"role": "assistant", "content": None, "tool_calls": _calls_from_json(value, 0)}
        return {"role": "assistant", "content": stripped}
    calls: list[dict[str, Any]] = []
    prose: list[str] = []
    position = 0
    while True:
        start = text.find(OPEN, position)
        if start < 0:
            prose.append(text[position:])
            break
        prose.append(text[position:start])
        end = text.find(CLOSE, start)
        body = text[start + len(OPEN) : end if end >= 0 else len(text)]
        try:
            value = _loads(body)
        except ValueError:
            raise _Unparseable(
                f"tool call block {len(calls)} is not valid JSON: {body.strip()[:80]!r}"
            ) from None
        calls += _calls_from_json(value, len(calls))
        if end < 0:
            break
        position = end + len(CLOSE)
    content = "".join(prose).strip() or None
    return {"role": "assistant", "content": content, "tool_calls": calls}


def parse_message(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message dict in canonical form (raises _Unparseable)."""
    role = message.get("role", "assistant")
    if role != "assistant":
        raise _Unparseable(f"an action must be an assistant message, got role {role!r}")
    content = message.get("content")
    if isinstance(content, list):  # content parts
        texts = [part.get("text", "") for part in content if isinstance(part, dict)]
        if not all(isinstance(text, str) for text in texts):
            raise _Unparseable("a content part's text must be a string")
        content = "".join(texts)
    if content is not None and not isinstance(content, str):
        raise _Unparseable(f"message content must be text, got {type(content).__name__}")
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise _Unparseable("tool_calls must be a list")
    if content and (THINK_CLOSE in content or THINK_OPEN in content):
        content = strip_think(content)
    content = content.strip() if content else None
    if not raw_calls:
        if content and OPEN in content:
            # A server that did not parse tool calls passes the raw text through.
            return parse_text(content)
        if not content:
            raise _Unparseable("empty message: no content and no tool calls")
        return {"role": "assistant", "content": content}
    calls = [_canonical_call(call, i) for i, call in enumerate(raw_calls)]
    return {"role": "assistant", "content": content or None, "tool_calls": calls}


def parse_action(action: Any) -> ParsedAction:
    """Parse raw completion text or a message dict; never raises (bad input is `unparseable`)."""
    # The decoded arguments serve the action being stepped: kept longer, they would outlive the
    # young GC generations and make the collector walk the whole heap every few thousand steps.
    _DECODED.clear()
    try:
        if isinstance(action, str):
            return ParsedAction(parse_text(action))
        if isinstance(action, dict):
            return ParsedAction(parse_message(action))
        raise _Unparseable(f"an action must be text or a message dict, got {type(action).__name__}")
    except _Unparseable as error:
        return ParsedAction(None, "unparseable", str(error))
    except RecursionError:
        return ParsedAction(None, "unparseable", "action nested too deeply")
