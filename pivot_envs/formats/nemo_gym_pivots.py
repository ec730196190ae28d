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
    extra_params,
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
        return {"role": "assistant", "content": None, "tool_calls": [chat_tool_call(action, "expected_action", "call_0")]}
    if kind == "function_call_batch":
        calls = action.get("calls")
        if not isinstance(calls, list) or not calls:
            raise MalformedRecord("malformed expected action", "function_call_batch needs a non-empty 'calls' list")
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [chat_tool_call(c, f"expected_action call {j}", f"call_{j}") for j, c in enumerate(calls)],
        }
    if kind == "message":
        text = content_text(action.get("content"), "expected_action")
        if text is None:
            raise MalformedRecord("malformed expected action", "the expected message has no content")
        return {"role": "assistant", "content": text}
    raise MalformedRecord("malformed expected action", f"expected_action type {kind!r} is not function_call, function_call_batch or message")


_ROW_KEYS = ("responses_create_params", "expected_action", "uuid", "id", "pivot_envs")


def nemo_gym_row_to_pivot(row: dict, default_id: str = "", domain: str = "") -> Pivot:
    """A NeMo-Gym pivot row -> Pivot; raises MalformedRecord (a ValueError) naming the bad field.

    id: `uuid` or `id` when the row has one, else `default_id`. The prefix comes from
    `responses_create_params.input`, the expert from `expected_action`; other top-level fields go
    to `context` (request parameters under `context["responses_create_params"]`).
    """
    if not isinstance(row, dict):
        raise MalformedRecord("wrong type", f"a row must be a JSON object, got {type(row).__name__}")
    params = request_params(row)
    messages = responses_to_messages(responses_input(params))
    expert = _expected_message(row.get("expected_action"))
    ours = row.get("pivot_envs") if isinstance(row.get("pivot_envs"), dict) else {}
    context = {k: v for k, v in row.items() if k not in _ROW_KEYS}
    context.update(ours.get("context") or {})
    extra = extra_params(params)
    if extra:
        context["responses_create_params"] = extra
    pivot_id = str(row.get("uuid") or row.get("id") or default_id)
    if not pivot_id:
        raise MalformedRecord("missing id", "the row has no uuid or id and no default id was given")
    source = ours.get("source")
    if not isinstance(source, dict):  # a row of NeMo-Gym's own: each row is its own trajectory
        source = {
            "trajectory": pivot_id,
            "turn": sum(1 for m in messages if m["role"] == "assistant"),
            "reward": source_reward(row.get("reward"), "reward"),
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
        tools=chat_tools(params.get("tools"), "responses_create_params.tools"),
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
        expected = {"type": "message", "content": content_text(content, "expert") or ""}
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


def write_nemo_gym_rows(pivots: Iterable[Pivot], path: str | os.PathLike[str]) -> int:
    """Write pivots as NeMo-Gym pivot rows (JSONL), with a progress bar on stderr; returns the count."""
    return write_pivots((pivot_to_nemo_gym_row(pivot) for pivot in pivots), path, desc="writing NeMo-Gym rows")
