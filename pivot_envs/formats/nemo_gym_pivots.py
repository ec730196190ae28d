"""The `nemo-gym-pivots` format: NeMo-Gym pivot rows (`responses_create_params.input` +
`expected_action`); each row *is* a pivot. Read and written, so our pivots feed NeMo-Gym and
NeMo-RL unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from pivot_envs.chat import tool_to_responses
from pivot_envs.formats.messages import chat_tool_call, chat_tools, content_text, source_reward
from pivot_envs.formats.records import MalformedRecord
from pivot_envs.formats.responses import (
    messages_to_responses,
    request_params,
    responses_input,
    responses_to_messages,
)
from pivot_envs.pivot import Pivot, Profile, write_pivots


def _expected_message(action: Any) -> dict:
    """A NeMo-Gym `expected_action` as an assistant message."""
    if not isinstance(action, dict):
        raise MalformedRecord("malformed expected action", "expected_action must be an object")
    kind = action.get("type")
    if kind == "function_call":
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [chat_tool_call(action, "expected_action", "call_0")],
        }
    if kind == "function_call_batch":
        calls = action.get("calls")
        if not isinstance(calls, list) or not calls:
            raise MalformedRecord(
                "malformed expected action", "function_call_batch needs a non-empty 'calls' list"
            )
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                chat_tool_call(c, f"expected_action call {j}", f"call_{j}") for j, c in enumerate(calls)
            ],
        }
    if kind == "message":
        text = content_text(action.get("content"), "expected_action")
        if text is None:
            raise MalformedRecord("malformed expected action", "the expected message has no content")
        return {"role": "assistant", "content": text}
    raise MalformedRecord(
        "malformed expected action",
        f"expected_action type {kind!r} is not function_call, function_call_batch or message",
    )


ROW_KEY = "nemo_gym_row"
"""The context key under which a pivot read from a NeMo-Gym row keeps what its own fields cannot
hold, so that writing it gives the row back exactly (key order aside): the input items, tool
schemas and expected action as given (only where they differ from how the pivot's fields are
written), which key held the id (`uuid`, `id` or none), request keys left out (`absent`),
whether the row had no `pivot_envs` block (`bare`) and a top-level field of the row's own named
like this key (`field`). A part that no longer reads to the pivot's
field (the pivot was edited) is ignored and the field is written afresh.
"""

# The fields the writer sets itself; a context field of the same name travels under pivot_envs.
_WRITTEN = ("responses_create_params", "expected_action", "uuid", "pivot_envs", ROW_KEY)


def _id_key(row: dict) -> str | None:
    """The field that holds a row's pivot id: `uuid`, else `id`, else none."""
    return next((key for key in ("uuid", "id") if row.get(key)), None)


def _expert_message(action: Any, call_ids: Any) -> dict:
    """The expected action as an assistant message, with our call ids where the row kept them."""
    expert = _expected_message(action)
    calls = expert.get("tool_calls") or []
    if (
        isinstance(call_ids, list)
        and len(call_ids) == len(calls)
        and all(isinstance(i, str) for i in call_ids)
    ):
        for call, call_id in zip(calls, call_ids):
            call["id"] = call_id
    return expert


def _as_given(row: dict, params: dict, messages: list[dict], tools: list[dict], expert: dict) -> dict:
    """What writing the pivot's fields would not give back of `row` (see ROW_KEY)."""
    kept: dict[str, Any] = {"id_key": _id_key(row)}
    if params.get("input") != messages_to_responses(messages):
        kept["input"] = params.get("input")
    if "tools" in params and params["tools"] != [tool_to_responses(tool) for tool in tools]:
        kept["tools"] = params["tools"]
    if row.get("expected_action") != _expected_action(expert):
        kept["expected_action"] = row.get("expected_action")
    absent = [key for key in ("input", "tools") if key not in params]
    if absent:
        kept["absent"] = absent
    if "pivot_envs" not in row:
        kept["bare"] = True
    if ROW_KEY in row:  # the row's own field of this name: the context key is taken
        kept["field"] = row[ROW_KEY]
    return kept


def nemo_gym_row_to_pivot(row: dict, default_id: str = "", domain: str = "") -> Pivot:
    """A NeMo-Gym pivot row -> Pivot; raises MalformedRecord (a ValueError) naming the bad field.

    id: `uuid` or `id` when the row has one, else `default_id`. The prefix comes from
    `responses_create_params.input`, the expert from `expected_action`; other top-level fields go
    to `context`, the request parameters besides input and tools (as given, nulls included) to
    `context["responses_create_params"]`, and what the pivot's fields cannot hold to
    `context[ROW_KEY]`, so that `pivot_to_nemo_gym_row` gives the row back exactly.
    """
    if not isinstance(row, dict):
        raise MalformedRecord("wrong type", f"a row must be a JSON object, got {type(row).__name__}")
    params = request_params(row)
    messages = responses_to_messages(responses_input(params))
    ours = row.get("pivot_envs") if isinstance(row.get("pivot_envs"), dict) else {}
    expert = _expert_message(row.get("expected_action"), ours.get("expert_call_ids"))
    tools = chat_tools(params.get("tools"), "responses_create_params.tools")
    id_key = _id_key(row)
    pivot_id = str(row[id_key]) if id_key else default_id
    if not pivot_id:
        raise MalformedRecord("missing id", "the row has no uuid or id and no default id was given")
    context = {k: v for k, v in row.items() if k not in (*_WRITTEN, id_key)}
    context.update(ours.get("context") or {})
    rest = {k: v for k, v in params.items() if k not in ("input", "tools")}
    if rest:
        context["responses_create_params"] = rest
    kept = _as_given(row, params, messages, tools, expert)
    if kept != {"id_key": "uuid"}:  # a row as this library writes it needs nothing kept
        context[ROW_KEY] = kept
    source = ours.get("source")
    if not isinstance(source, dict):  # a row of NeMo-Gym's own: each row is its own trajectory
        source = _bare_source(pivot_id, messages, row)
    profile = ours.get("profile")
    return Pivot(
        id=pivot_id,
        domain=domain or str(ours.get("domain", "")),
        messages=messages,
        expert=expert,
        tools=tools,
        context=context,
        source=source,
        profile=Profile.from_dict(profile) if isinstance(profile, dict) else None,
    )


def _bare_source(pivot_id: str, messages: list[dict], row: dict) -> dict:
    """The source of a row of NeMo-Gym's own: the row is its own trajectory, the pivot its last turn."""
    return {
        "trajectory": pivot_id,
        "turn": sum(1 for m in messages if m["role"] == "assistant"),
        "reward": source_reward(row.get("reward"), "reward"),
        "format": "nemo-gym-pivots",
    }


def _expected_action(expert: dict) -> dict:
    """An assistant message as a NeMo-Gym `expected_action` (call ids dropped: it has none)."""
    calls = [
        {
            "type": "function_call",
            "name": call["function"]["name"],
            "arguments": call["function"]["arguments"],
        }
        for call in expert.get("tool_calls") or []
    ]
    if len(calls) > 1:
        return {"type": "function_call_batch", "calls": calls}
    if calls:
        return calls[0]
    return {"type": "message", "content": content_text(expert.get("content"), "expert") or ""}


def _still(kept: dict, key: str, read: Any, field: Any) -> bool:
    """Whether the part of the row kept under `key` still reads to the pivot's field."""
    if key not in kept:
        return False
    try:
        return read(kept[key]) == field
    except ValueError:  # a kept part that no longer reads is stale
        return False


def pivot_to_nemo_gym_row(pivot: Pivot) -> dict:
    """A Pivot -> NeMo-Gym pivot row (`responses_create_params.input` items, Responses-form
    `tools`, `expected_action`), so pivots feed NeMo-Gym/NeMo-RL unchanged.

    The pivot id becomes `uuid`; context fields become top-level row fields (as NeMo-Gym passes
    task data to its verifiers) and `context["responses_create_params"]` the request parameters;
    domain, source and profile travel under `pivot_envs` so that reading the row back restores them.
    A pivot read from a NeMo-Gym row and not edited since is written back as that row exactly
    (see ROW_KEY): its own id key, its items as given, no `pivot_envs` block if it had none.
    """
    context = dict(pivot.context)
    kept = context.pop(ROW_KEY, None)
    kept = kept if isinstance(kept, dict) else {}
    params = dict(context.pop("responses_create_params", None) or {})
    absent = kept.get("absent") or []
    call_ids = [call.get("id") or f"call_{i}" for i, call in enumerate(pivot.expert.get("tool_calls") or [])]
    if _still(
        kept, "input", lambda items: responses_to_messages(responses_input({"input": items})), pivot.messages
    ):
        params["input"] = kept["input"]
    elif "input" not in absent or pivot.messages:
        params["input"] = messages_to_responses(pivot.messages)
    if _still(kept, "tools", lambda tools: chat_tools(tools, "tools"), pivot.tools):
        params["tools"] = kept["tools"]
    elif "tools" not in absent or pivot.tools:
        params["tools"] = [tool_to_responses(tool) for tool in pivot.tools]
    expected = _expected_action(pivot.expert)
    if _still(kept, "expected_action", lambda action: _expert_message(action, call_ids), pivot.expert):
        expected = kept["expected_action"]
    id_key = kept.get("id_key", "uuid")
    row: dict[str, Any] = {"responses_create_params": params, "expected_action": expected}
    if id_key:
        row[id_key] = pivot.id
    ours: dict[str, Any] = {"domain": pivot.domain, "source": pivot.source}
    read_ids = [call["id"] for call in _expected_message(expected).get("tool_calls") or []]
    if call_ids != read_ids:  # NeMo-Gym's expected action has no call ids of ours; keep them for the way back
        ours["expert_call_ids"] = call_ids
    clashing = {k: v for k, v in context.items() if k in (*_WRITTEN, id_key)}
    if clashing:
        ours["context"] = clashing
    row.update({k: v for k, v in context.items() if k not in clashing})
    if pivot.profile is not None:
        ours["profile"] = pivot.profile.to_dict()
    plain = pivot.source == _bare_source(pivot.id, pivot.messages, row) and set(ours) <= {"domain", "source"}
    if not (kept.get("bare") and plain):
        row["pivot_envs"] = ours
    if "field" in kept:
        row[ROW_KEY] = kept["field"]
    return row


def write_nemo_gym_rows(pivots: Iterable[Pivot], path: str | os.PathLike[str]) -> int:
    """Write pivots as NeMo-Gym pivot rows (JSONL), with a progress bar on stderr; returns the count."""
    return write_pivots(
        (pivot_to_nemo_gym_row(pivot) for pivot in pivots), path, desc="writing NeMo-Gym rows"
    )
