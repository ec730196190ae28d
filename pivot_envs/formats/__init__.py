"""Trajectory formats: readers (detected by content) onto the canonical chat form, and a NeMo-Gym writer.

Formats (`detect_format` names):

- ``openai-chat``: a JSON list of episodes with a `traj` or `messages` message list (tau-bench
  results), or JSONL of ``{"messages", "tools"?, "id"?, "reward"?}``.
- ``nemo-gym-pivots``: NeMo-Gym pivot rows (`responses_create_params.input` + `expected_action`);
  each row *is* a pivot.
- ``nemo-gym-rollouts``: NeMo-Gym rollouts (`responses_create_params.input` + `response.output`,
  `reward`); a row without `response` is a task prompt (a trajectory with no assistant turn).
- ``sharegpt``: ``{"conversations": [{"from", "value"}], "tools"?}``.
- ``pivots``: this library's pivot JSONL (see `pivot_envs.pivot`).

Files may be gzip-compressed (detected by their magic bytes). A malformed record is reported in a
`ReadReport` as ``file:line: reason`` (``file:[i]: reason`` for the i-th element of a JSON list) and
skipped; reading never raises on bad content.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import warnings
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pivot_envs.chat import tool_call, tool_to_chat, tool_to_responses
from pivot_envs.pivot import Pivot, PivotFormatError, Profile

if TYPE_CHECKING:
    from pivot_envs.extract import ExtractConfig

FORMATS = ("openai-chat", "nemo-gym-pivots", "nemo-gym-rollouts", "sharegpt", "pivots")
ROLES = ("system", "developer", "user", "assistant", "tool")
# How many leading records detect_format looks at before giving up.
_DETECT_RECORDS = 50


@dataclass
class Trajectory:
    """One expert trajectory in canonical chat form.

    id:       stable and unique within its source file.
    messages: OpenAI chat messages (system/user/assistant/tool).
    tools:    OpenAI function tool schemas in chat form.
    reward:   the source episode's reward, when the format records one.
    context:  domain data carried over from the source (task metadata, instance id, ...).
    format:   the format it was read from.
    """

    id: str
    messages: list[dict]
    tools: list[dict]
    reward: float | None = None
    context: dict = field(default_factory=dict)
    format: str = ""

    @property
    def assistant_turns(self) -> int:
        return sum(1 for m in self.messages if m.get("role") == "assistant")


@dataclass
class ReadReport:
    """What a read did: records read, trajectories and pivots produced, and what was skipped and why.

    skipped:  malformed records by reason (each also in `problems` as "file:line: reason").
    filtered: candidates left out on purpose by the extraction rules (ExtractConfig), by reason.
    no_assistant: trajectories without any assistant turn (task prompts): read, but no candidates.
    """

    records: int = 0
    trajectories: int = 0
    pivots: int = 0
    no_assistant: int = 0
    skipped: Counter = field(default_factory=Counter)
    filtered: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    formats: dict[str, str] = field(default_factory=dict)

    def skip(self, where: str, reason: str, detail: str = "") -> None:
        """Record a skipped record: `reason` is the counted category, `detail` the specifics."""
        self.skipped[reason] += 1
        self.problems.append(f"{where}: {reason}{': ' + detail if detail else ''}")

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())

    def summary(self) -> str:
        """A few lines: counts, then skipped and filtered by reason."""
        lines = [
            f"records read: {self.records}",
            f"trajectories: {self.trajectories} ({self.no_assistant} without an assistant turn)",
            f"pivots: {self.pivots}",
            f"skipped (malformed): {self.skipped_total}",
        ]
        lines += [f"  {reason}: {count}" for reason, count in sorted(self.skipped.items())]
        if self.filtered:
            lines.append(f"filtered by the extraction rules: {sum(self.filtered.values())}")
            lines += [f"  {reason}: {count}" for reason, count in sorted(self.filtered.items())]
        return "\n".join(lines)


class _Malformed(ValueError):
    """A record that cannot be read: `reason` is the counted category, the message the detail."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


# -- raw records ------------------------------------------------------------------------------------


def _load_bytes(path: Path, report: ReadReport) -> bytes | None:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":  # gzip magic, whatever the file is called
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as error:
            report.skip(str(path), "unreadable file", f"not a valid gzip stream ({error})")
            return None
    return data


def _records(path: str | os.PathLike[str], report: ReadReport) -> Iterator[tuple[str, Any]]:
    """Yield (where, parsed JSON record) for a JSON list, a single JSON object or a JSONL file.

    What does not parse is reported ("file:line: reason") and skipped.
    """
    path = Path(path)
    data = _load_bytes(path, report)
    if data is None:
        return
    if data.lstrip()[:1] == b"[":  # a JSON list of records (tau-bench results)
        report.records += 1
        try:
            whole = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError as error:
            report.skip(f"{path}:1", "invalid JSON", f"not UTF-8 at byte {error.start}")
            return
        except json.JSONDecodeError as error:
            report.skip(f"{path}:{error.lineno}", "invalid JSON", f"the JSON list does not parse ({error.msg})")
            return
        if isinstance(whole, list):
            report.records += len(whole) - 1
            for index, record in enumerate(whole):
                yield f"{path}:[{index}]", record
            return
        yield f"{path}:1", whole
        return
    lines = data.split(b"\n")
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        report.records += 1
        where = f"{path}:{number}"
        try:
            yield where, json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as error:
            report.skip(where, "invalid JSON", f"not UTF-8 at byte {error.start}")
        except json.JSONDecodeError as error:
            if number == 1 and _single_document(data, report):
                # One pretty-printed JSON object, not JSONL.
                yield f"{path}:1", json.loads(data.decode("utf-8"))
                return
            report.skip(where, "invalid JSON", f"{error.msg} at column {error.colno}")


def _single_document(data: bytes, report: ReadReport) -> bool:
    try:
        whole = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    if isinstance(whole, dict):
        report.records = 1
        return True
    return False


def _record_kind(record: Any) -> str | None:
    if not isinstance(record, dict):
        return None
    if isinstance(record.get("expert"), dict) and "messages" in record and "id" in record:
        return "pivots"
    if "responses_create_params" in record:
        return "nemo-gym-pivots" if "expected_action" in record else "nemo-gym-rollouts"
    if "conversations" in record:
        return "sharegpt"
    if "traj" in record or "messages" in record:
        return "openai-chat"
    return None


def detect_format(path: str | os.PathLike[str]) -> str:
    """The format of a file, from its content (not its name); raises ValueError naming the file if unknown."""
    seen: list[str] = []
    for count, (_, record) in enumerate(_records(path, ReadReport())):
        kind = _record_kind(record)
        if kind is not None:
            return kind
        seen.append(", ".join(sorted(record)[:6]) if isinstance(record, dict) else type(record).__name__)
        if count + 1 >= _DETECT_RECORDS:
            break
    shown = f"; first records look like: {seen[:3]}" if seen else " (no JSON records found)"
    raise ValueError(f"{path}: cannot detect the trajectory format{shown}; expected one of {', '.join(FORMATS)}")


# -- chat messages ----------------------------------------------------------------------------------


def _text(content: Any, where: str) -> str | None:
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
                raise _Malformed("unsupported content", f"{where}: content part of type {kind!r} has no text")
        return "".join(texts)
    raise _Malformed("wrong type", f"{where}: content must be a string or content parts, got {type(content).__name__}")


def _arguments(arguments: Any, where: str) -> str:
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        return arguments
    if isinstance(arguments, (dict, list)):
        return json.dumps(arguments, ensure_ascii=False)
    raise _Malformed("malformed tool call", f"{where}: arguments must be a JSON string or object, got {type(arguments).__name__}")


def _chat_tool_call(call: Any, where: str, default_id: str) -> dict:
    if not isinstance(call, dict):
        raise _Malformed("malformed tool call", f"{where}: a tool call must be an object")
    function = call.get("function", call)
    if not isinstance(function, dict):
        raise _Malformed("malformed tool call", f"{where}: 'function' must be an object")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise _Malformed("malformed tool call", f"{where}: the tool call has no name")
    call_id = call.get("id") or call.get("call_id") or default_id
    return tool_call(name, _arguments(function.get("arguments"), where), str(call_id))


def normalize_messages(messages: Any, where: str = "messages") -> list[dict]:
    """Validate chat messages and bring them to the canonical form; raises ValueError naming the message.

    Keeps `role`, `content` (content parts joined to text), assistant `tool_calls` (ids filled in
    where missing, arguments as JSON strings; a legacy `function_call` becomes one tool call),
    `reasoning_content`, and a tool reply's `tool_call_id` and `name`.
    """
    if not isinstance(messages, list):
        raise _Malformed("wrong type", f"{where} must be a list, got {type(messages).__name__}")
    out = []
    for index, message in enumerate(messages):
        here = f"message {index}"
        if not isinstance(message, dict):
            raise _Malformed("wrong type", f"{here} must be an object, got {type(message).__name__}")
        role = message.get("role")
        if role == "function":  # the legacy name of a tool reply
            role = "tool"
        if role not in ROLES:
            raise _Malformed("unknown role", f"{here}: role {role!r} is not one of {', '.join(ROLES)}")
        clean: dict[str, Any] = {"role": role, "content": _text(message.get("content"), here)}
        if role == "assistant":
            calls = message.get("tool_calls")
            if calls is None and isinstance(message.get("function_call"), dict):
                calls = [{"function": message["function_call"]}]
            if calls:
                if not isinstance(calls, list):
                    raise _Malformed("malformed tool call", f"{here}: tool_calls must be a list")
                clean["tool_calls"] = [
                    _chat_tool_call(call, f"{here} tool call {j}", f"call_{index}_{j}") for j, call in enumerate(calls)
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


def _chat_tools(tools: Any, where: str = "tools") -> list[dict]:
    if tools is None:
        return []
    if isinstance(tools, str):  # ShareGPT and some exports store the schemas as a JSON string
        try:
            tools = json.loads(tools) if tools.strip() else []
        except json.JSONDecodeError as error:
            raise _Malformed("malformed tools", f"{where} is not valid JSON ({error.msg})") from None
    if not isinstance(tools, list):
        raise _Malformed("malformed tools", f"{where} must be a list, got {type(tools).__name__}")
    out = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise _Malformed("malformed tools", f"{where}[{index}] must be an object")
        chat = tool_to_chat(tool)
        if not isinstance(chat["function"].get("name"), str) or not chat["function"]["name"]:
            raise _Malformed("malformed tools", f"{where}[{index}] has no name")
        out.append(chat)
    return out


# -- Responses API items <-> chat -----------------------------------------------------------------


def responses_to_messages(items: Any) -> list[dict]:
    """OpenAI Responses API items -> canonical chat messages.

    A model turn (optional `reasoning`, an assistant `message`, `function_call`s) becomes one
    assistant message: reasoning text goes to `reasoning_content`, consecutive function calls
    merge into `tool_calls` (`call_id` -> id); `function_call_output` becomes a `tool` message
    with `tool_call_id`. Items without a `type` but with a `role` are messages. Raises ValueError
    naming the item for an unsupported item type.
    """
    if not isinstance(items, list):
        raise _Malformed("wrong type", f"input must be a list of items, got {type(items).__name__}")
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
            raise _Malformed("wrong type", f"{here} must be an object, got {type(item).__name__}")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ROLES or role == "tool":
                raise _Malformed("unknown role", f"{here}: message role {role!r} is not system, developer, user or assistant")
            text = _text(item.get("content"), here)
            if role == "assistant":
                open_turn(fresh=True)["content"] = text
            else:
                close()
                messages.append({"role": role, "content": text})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            text = _text(parts, here) or ""
            current = open_turn(fresh=True)
            previous = current.get("reasoning_content")
            current["reasoning_content"] = f"{previous}\n{text}" if previous else text
        elif kind == "function_call":
            current = open_turn(fresh=False)
            calls = current.setdefault("tool_calls", [])
            calls.append(_chat_tool_call(item, here, f"call_{index}"))
        elif kind == "function_call_output":
            close()
            output = item.get("output")
            if not isinstance(output, str):
                output = _text(output, here) if isinstance(output, list) else json.dumps(output, ensure_ascii=False)
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise _Malformed("malformed tool output", f"{here}: function_call_output has no call_id")
            messages.append({"role": "tool", "content": output, "tool_call_id": call_id})
        else:
            raise _Malformed("unsupported item", f"{here}: Responses item type {kind!r} is not supported")
    close()
    return messages


def messages_to_responses(messages: list[dict]) -> list[dict]:
    """Canonical chat messages -> Responses API input items (the inverse of `responses_to_messages`)."""
    items: list[dict] = []
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            if message.get("reasoning_content"):
                items.append({"type": "reasoning", "summary": [{"type": "summary_text", "text": message["reasoning_content"]}]})
            if message.get("content") is not None:
                items.append({
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": message["content"], "annotations": []}],
                })
            for call in message.get("tool_calls") or []:
                function = call["function"]
                items.append({
                    "type": "function_call",
                    "name": function["name"],
                    "arguments": function["arguments"],
                    "call_id": call["id"],
                })
        elif role == "tool":
            items.append({"type": "function_call_output", "call_id": message.get("tool_call_id", ""), "output": message.get("content") or ""})
        else:
            items.append({"type": "message", "role": role, "content": message.get("content") or ""})
    return items


# -- one reader per format --------------------------------------------------------------------------


def _reward(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Malformed("wrong type", f"{where}: reward must be a number, got {type(value).__name__}")
    return float(value)


def _openai_chat(record: dict, default_id: str, prefix: str) -> Trajectory:
    messages = record.get("messages", record.get("traj"))
    if "task_id" in record and "traj" in record:  # a tau-bench episode: task and trial identify it
        default_id = f"{prefix}/task{record['task_id']}/trial{record.get('trial', 0)}"
    skip = {"messages", "traj", "tools", "reward", "id"}
    return Trajectory(
        id=str(record.get("id") or default_id),
        messages=normalize_messages(messages, "messages" if "messages" in record else "traj"),
        tools=_chat_tools(record.get("tools")),
        reward=_reward(record.get("reward"), "reward"),
        context={k: v for k, v in record.items() if k not in skip},
        format="openai-chat",
    )


_SHAREGPT_ROLES = {
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


def _sharegpt(record: dict, default_id: str) -> Trajectory:
    turns = record.get("conversations")
    if not isinstance(turns, list):
        raise _Malformed("wrong type", f"conversations must be a list, got {type(turns).__name__}")
    messages: list[dict] = []
    if isinstance(record.get("system"), str) and record["system"]:
        messages.append({"role": "system", "content": record["system"]})
    pending: list[str] = []  # call ids awaiting an observation, in order
    for index, turn in enumerate(turns):
        here = f"conversations[{index}]"
        if not isinstance(turn, dict):
            raise _Malformed("wrong type", f"{here} must be an object")
        speaker = turn.get("from", turn.get("role"))
        role = _SHAREGPT_ROLES.get(speaker) if isinstance(speaker, str) else None
        value = turn.get("value", turn.get("content"))
        if role is None:
            raise _Malformed("unknown role", f"{here}: 'from' is {speaker!r}")
        if role == "function_call":
            try:
                parsed = json.loads(value) if isinstance(value, str) else value
            except json.JSONDecodeError as error:
                raise _Malformed("malformed tool call", f"{here}: the function call is not JSON ({error.msg})") from None
            calls = parsed if isinstance(parsed, list) else [parsed]
            tool_calls = [_chat_tool_call(call, f"{here} call {j}", f"call_{index}_{j}") for j, call in enumerate(calls)]
            messages.append({"role": "assistant", "content": None, "tool_calls": tool_calls})
            pending = [call["id"] for call in tool_calls]
        elif role == "tool":
            message = {"role": "tool", "content": value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}
            if pending:
                message["tool_call_id"] = pending.pop(0)
            messages.append(message)
        else:
            if not isinstance(value, str):
                raise _Malformed("wrong type", f"{here}: value must be a string, got {type(value).__name__}")
            messages.append({"role": role, "content": value})
            pending = []
    skip = {"conversations", "tools", "reward", "id", "system"}
    return Trajectory(
        id=str(record.get("id") or default_id),
        messages=messages,
        tools=_chat_tools(record.get("tools")),
        reward=_reward(record.get("reward"), "reward"),
        context={k: v for k, v in record.items() if k not in skip},
        format="sharegpt",
    )


def _params(record: dict) -> dict:
    params = record.get("responses_create_params")
    if not isinstance(params, dict):
        raise _Malformed("wrong type", "responses_create_params must be an object")
    return params


def _extra_params(params: dict) -> dict:
    """Request parameters worth keeping (set ones), without the input and tools we convert."""
    return {k: v for k, v in params.items() if k not in ("input", "tools") and v is not None}


def _responses_input(params: dict) -> list:
    items = params.get("input", [])
    if isinstance(items, str):  # the Responses API accepts a bare user string as input
        items = [{"type": "message", "role": "user", "content": items}]
    return items


def _rollout(record: dict, default_id: str) -> Trajectory:
    params = _params(record)
    response = record.get("response")
    if response is not None and not isinstance(response, dict):
        raise _Malformed("wrong type", "response must be an object")
    output = (response or {}).get("output") or []
    items = _responses_input(params)
    if not isinstance(items, list) or not isinstance(output, list):
        raise _Malformed("wrong type", "input and response.output must be lists of items")
    messages = responses_to_messages([*items, *output])
    extra = _extra_params(params)
    context: dict[str, Any] = {k: v for k, v in record.items() if k not in ("responses_create_params", "response", "reward", "instance_config")}
    metadata = extra.pop("metadata", None)
    if isinstance(metadata, dict):  # task metadata (instance id, task name, image, workdir): lift it up
        for key, value in metadata.items():
            context.setdefault(key, value)
    if extra:
        context["responses_create_params"] = extra
    if response and response.get("model"):
        context.setdefault("model", response["model"])
    instance = context.get("instance_id")
    if isinstance(instance, str) and instance and not record.get("uuid"):
        default_id = f"{instance}/rollout{record.get('_ng_rollout_index', 0)}"
    return Trajectory(
        id=str(record.get("uuid") or record.get("id") or default_id),
        messages=messages,
        tools=_chat_tools(params.get("tools"), "responses_create_params.tools"),
        reward=_reward(record.get("reward"), "reward"),
        context=context,
        format="nemo-gym-rollouts",
    )


def _expected_message(action: Any) -> dict:
    """A NeMo-Gym `expected_action` as an assistant message."""
    if not isinstance(action, dict):
        raise _Malformed("malformed expected action", "expected_action must be an object")
    kind = action.get("type")
    if kind == "function_call":
        return {"role": "assistant", "content": None, "tool_calls": [_chat_tool_call(action, "expected_action", "call_0")]}
    if kind == "function_call_batch":
        calls = action.get("calls")
        if not isinstance(calls, list) or not calls:
            raise _Malformed("malformed expected action", "function_call_batch needs a non-empty 'calls' list")
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [_chat_tool_call(c, f"expected_action call {j}", f"call_{j}") for j, c in enumerate(calls)],
        }
    if kind == "message":
        text = _text(action.get("content"), "expected_action")
        if text is None:
            raise _Malformed("malformed expected action", "the expected message has no content")
        return {"role": "assistant", "content": text}
    raise _Malformed("malformed expected action", f"expected_action type {kind!r} is not function_call, function_call_batch or message")


_ROW_KEYS = ("responses_create_params", "expected_action", "uuid", "id", "pivot_envs")


def nemo_gym_row_to_pivot(row: dict, default_id: str = "", domain: str = "") -> Pivot:
    """A NeMo-Gym pivot row -> Pivot; raises ValueError naming the bad field.

    id: `uuid` or `id` when the row has one, else `default_id`. The prefix comes from
    `responses_create_params.input`, the expert from `expected_action`; other top-level fields go
    to `context` (request parameters under `context["responses_create_params"]`).
    """
    if not isinstance(row, dict):
        raise _Malformed("wrong type", f"a row must be a JSON object, got {type(row).__name__}")
    params = _params(row)
    messages = responses_to_messages(_responses_input(params))
    expert = _expected_message(row.get("expected_action"))
    ours = row.get("pivot_envs") if isinstance(row.get("pivot_envs"), dict) else {}
    context = {k: v for k, v in row.items() if k not in _ROW_KEYS}
    context.update(ours.get("context") or {})
    extra = _extra_params(params)
    if extra:
        context["responses_create_params"] = extra
    pivot_id = str(row.get("uuid") or row.get("id") or default_id)
    if not pivot_id:
        raise _Malformed("missing id", "the row has no uuid or id and no default id was given")
    source = ours.get("source")
    if not isinstance(source, dict):  # a row of NeMo-Gym's own: each row is its own trajectory
        source = {
            "trajectory": pivot_id,
            "turn": sum(1 for m in messages if m["role"] == "assistant"),
            "reward": _reward(row.get("reward"), "reward"),
            "format": "nemo-gym-pivots",
        }
    call_ids = ours.get("expert_call_ids")
    calls = expert.get("tool_calls") or []
    if isinstance(call_ids, list) and len(call_ids) == len(calls) and all(isinstance(i, str) for i in call_ids):
        for call, call_id in zip(calls, call_ids):
            call["id"] = call_id
    profile = ours.get("profile")
    return Pivot(
        id=pivot_id,
        domain=domain or str(ours.get("domain", "")),
        messages=messages,
        expert=expert,
        tools=_chat_tools(params.get("tools"), "responses_create_params.tools"),
        context=context,
        source=source,
        profile=Profile.from_dict(profile) if isinstance(profile, dict) else None,
    )


def pivot_to_nemo_gym_row(pivot: Pivot) -> dict:
    """A Pivot -> NeMo-Gym pivot row (`responses_create_params.input` items, Responses-form
    `tools`, `expected_action`), so pivots feed NeMo-Gym/NeMo-RL unchanged.

    The pivot id becomes `uuid`; context fields become top-level row fields (as NeMo-Gym passes
    task data to its verifiers) and `context["responses_create_params"]` the request parameters;
    domain, source and profile travel under `pivot_envs` so that reading the row back restores them.
    """
    context = dict(pivot.context)
    params = dict(context.pop("responses_create_params", None) or {})
    params["input"] = messages_to_responses(pivot.messages)
    params["tools"] = [tool_to_responses(tool) for tool in pivot.tools]
    calls = [
        {"type": "function_call", "name": call["function"]["name"], "arguments": call["function"]["arguments"]}
        for call in pivot.expert.get("tool_calls") or []
    ]
    if len(calls) > 1:
        expected: dict[str, Any] = {"type": "function_call_batch", "calls": calls}
    elif calls:
        expected = calls[0]
    else:
        content = pivot.expert.get("content")
        expected = {"type": "message", "content": _text(content, "expert") or ""}
    row: dict[str, Any] = {"uuid": pivot.id, "responses_create_params": params, "expected_action": expected}
    ours: dict[str, Any] = {"domain": pivot.domain, "source": pivot.source}
    if calls:  # NeMo-Gym's expected action has no call ids; keep ours for the way back
        ours["expert_call_ids"] = [call.get("id") or f"call_{i}" for i, call in enumerate(pivot.expert["tool_calls"])]
    clashing = {k: v for k, v in context.items() if k in _ROW_KEYS}
    if clashing:
        ours["context"] = clashing
    row.update({k: v for k, v in context.items() if k not in _ROW_KEYS})
    if pivot.profile is not None:
        ours["profile"] = pivot.profile.to_dict()
    row["pivot_envs"] = ours
    return row


def _own_pivot(record: dict) -> Pivot:
    """A record of our pivot JSONL, kept as is once its messages, expert and tools are checked."""
    pivot = Pivot.from_dict(record)
    normalize_messages(pivot.messages)
    normalize_messages([pivot.expert], "expert")
    if not isinstance(record.get("tools") or [], list):
        raise _Malformed("malformed tools", "tools must be a list")
    _chat_tools(pivot.tools)
    if pivot.expert.get("role") != "assistant":
        raise _Malformed("malformed pivot", f"the expert must be an assistant message, got role {pivot.expert.get('role')!r}")
    return pivot


def _default_prefix(path: Path) -> str:
    """tau-bench trajectory ids: `tau-<env>/task<id>/trial<n>`, the env from the folder name."""
    return f"tau-{path.parent.name}" if path.parent.name else path.stem


def _read(path: Path, report: ReadReport, id_prefix: str | None) -> Iterator[tuple[str, str, Trajectory | Pivot]]:
    """(where, format, Trajectory or Pivot) per good record; malformed ones go to the report."""
    stem = path.name.split(".")[0]
    prefix = id_prefix or _default_prefix(path)
    seen_ids: set[str] = set()
    for where, record in _records(path, report):
        kind = _record_kind(record)
        if kind is None:
            keys = ", ".join(sorted(record)[:8]) if isinstance(record, dict) else type(record).__name__
            report.skip(where, "unrecognized record", f"not a trajectory or pivot in any known format ({keys})")
            continue
        report.formats.setdefault(str(path), kind)
        default_id = f"{id_prefix or stem}/{where.rsplit(':', 1)[1].strip('[]')}"
        try:
            if kind == "pivots":
                item: Trajectory | Pivot = _own_pivot(record)
            elif kind == "nemo-gym-pivots":
                item = nemo_gym_row_to_pivot(record, default_id)
            elif kind == "nemo-gym-rollouts":
                item = _rollout(record, default_id)
            elif kind == "sharegpt":
                item = _sharegpt(record, default_id)
            else:
                item = _openai_chat(record, default_id, prefix)
        except _Malformed as error:
            report.skip(where, error.reason, error.detail)
            continue
        except PivotFormatError as error:
            report.skip(where, "malformed pivot", str(error))
            continue
        except (TypeError, ValueError, AttributeError, KeyError) as error:  # bad shapes we did not foresee
            report.skip(where, "malformed record", f"{type(error).__name__}: {error}")
            continue
        if item.id in seen_ids:  # keep ids unique within a file: a repeated id gets its position
            item.id = f"{item.id}@{where.rsplit(':', 1)[1].strip('[]')}"
        seen_ids.add(item.id)
        yield where, kind, item


def read_trajectories(
    path: str | os.PathLike[str], report: ReadReport | None = None, *, id_prefix: str | None = None
) -> Iterator[Trajectory]:
    """Stream the trajectories of a file in any supported format (detected per record, by content).

    Pivot files (NeMo-Gym pivot rows, our pivot JSONL) yield prefix + expert as a trajectory.
    Malformed records are counted in `report` with "file:line: reason" and skipped; bad content
    never raises. `id_prefix` replaces the default id prefix (the file's stem; `tau-<folder>` for
    tau-bench episodes).
    """
    report = report if report is not None else ReadReport()
    path = Path(path)
    for _, _, item in _read(path, report, id_prefix):
        if isinstance(item, Pivot):
            item = Trajectory(item.trajectory_id, [*item.messages, item.expert], item.tools, item.source.get("reward"), item.context, report.formats[str(path)])
        report.trajectories += 1
        if item.assistant_turns == 0:
            report.no_assistant += 1
        yield item


def read_as_pivots(
    path: str | os.PathLike[str],
    domain: str = "",
    report: ReadReport | None = None,
    *,
    config: ExtractConfig | None = None,
    id_prefix: str | None = None,
) -> list[Pivot]:
    """Pivots from a file: our pivot JSONL (.gz) as is, NeMo-Gym pivot rows one pivot per row, and
    any trajectory format through `extract_pivots` (by default every assistant turn a candidate).

    `domain` (or `config.domain`) fills in pivots that have none. The `config`'s turn and reward
    rules apply to ready-made pivots too. Without a `report`, skipped records are announced with a
    warning naming the first problem.
    """
    from pivot_envs.extract import ExtractConfig, extract_pivots, reward_rejection, turn_rejection

    config = config or ExtractConfig(domain=domain)
    domain = config.domain or domain
    own = report if report is not None else ReadReport()
    path = Path(path)
    pivots: list[Pivot] = []
    trajectories: list[Trajectory] = []
    for _, _, item in _read(path, own, id_prefix):
        if isinstance(item, Pivot):
            rejected = reward_rejection(item.source.get("reward"), config) or turn_rejection(item.expert, config)
            if rejected:
                own.filtered[rejected] += 1
                continue
            item.domain = item.domain or domain
            pivots.append(item)
            own.pivots += 1
        else:
            own.trajectories += 1
            if item.assistant_turns == 0:
                own.no_assistant += 1
            trajectories.append(item)
    if trajectories:
        pivots.extend(extract_pivots(trajectories, replace(config, domain=domain), report=own))
    if report is None and own.skipped_total:
        warnings.warn(
            f"{path}: skipped {own.skipped_total} malformed record(s); first: {own.problems[0]}", stacklevel=2
        )
    return pivots


def write_nemo_gym_rows(pivots: Iterable[Pivot], path: str | os.PathLike[str]) -> int:
    """Write pivots as NeMo-Gym pivot rows (JSONL), with a progress bar on stderr; returns the count."""
    from tqdm import tqdm

    from pivot_envs.config import progress_disabled

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", encoding="utf-8") as handle:
        for pivot in tqdm(pivots, desc="writing NeMo-Gym rows", unit=" rows", file=sys.stderr, disable=progress_disabled()):
            handle.write(json.dumps(pivot_to_nemo_gym_row(pivot), ensure_ascii=False) + "\n")
            count += 1
    return count
