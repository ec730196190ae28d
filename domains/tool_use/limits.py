"""Per-step limits of `pivot/tool-use-v0`: no action, however degenerate, may exhaust the machine.

Every backend (recorded, tau-airline, http, a user's object) runs under the same bounds, set with
`gym.make("pivot/tool-use-v0", limits={...})`:

- a turn may make at most `max_calls` tool calls (or as many as the pivot's expert turn makes, if
  that is more); a turn with more is the action's fault: reward 0, category `too_many_tool_calls`,
  valid, and none of its calls runs;
- a turn's call arguments may hold at most `argument_bytes` bytes of JSON together (or as many as
  the expert turn's, if more); a turn with more is refused like one with too many calls (reward
  0, category `arguments_too_large`, valid, nothing runs): no tool reads a megabyte, and an
  argument without effect (a `think` thought) cannot be stuffed to earn execution equivalence;
- each tool result keeps at most `output_bytes` bytes, and the results of one step at most
  `observation_bytes` together (later results are cut to what is left); a cut result keeps its
  head and tail around a marker that says how many bytes were cut;
- a step's tool execution has `step_timeout_s` seconds of wall time; past it the step is an
  infrastructure failure (valid=False), since the action's calls are bounded in number and each
  call's work is bounded, so the time went to a slow backend, not to the action.

The http backend's own bounds (a total deadline per attempt, a reply size cap) are fields of
`HttpBackendConfig`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pivot_envs.config import at_least, between, config_of, option
from pivot_envs.text import join_cut


@dataclass
class ToolUseLimits:
    """Bounds of one step of the tool-use env, applied to every backend."""

    max_calls: int = option(
        16,
        "most tool calls one turn may make (the pivot's expert turn's count, if higher); a turn with more scores 0 "
        "as too_many_tool_calls and none of its calls runs",
    )
    argument_bytes: int = option(
        65536,
        "UTF-8 bytes of JSON all the call arguments of one turn may hold (the pivot's expert turn's, if more); "
        "a turn with more scores 0 as arguments_too_large and none of its calls runs",
    )
    output_bytes: int = option(
        32768,
        "UTF-8 bytes kept of each tool result (head and tail halves; the middle is cut with a marker naming the "
        "bytes cut); the largest airline result, a one-stop search, is 25 KB",
    )
    observation_bytes: int = option(
        131072,
        "UTF-8 bytes kept of all the tool results of one step together; later results are cut to what is left",
    )
    step_timeout_s: float = option(
        60.0,
        "wall-clock seconds for a step's tool execution; past it the step is an infrastructure failure (valid=False)",
    )

    def __post_init__(self) -> None:
        at_least(self, 1, "max_calls", "argument_bytes", "output_bytes", "observation_bytes")
        between(self, "step_timeout_s", 0, float("inf"), open_low=True, open_high=True)

    @classmethod
    def of(cls, value: ToolUseLimits | dict[str, Any] | None) -> ToolUseLimits:
        """Limits from a ToolUseLimits, a dict of its fields (unknown names refused), or None (the defaults)."""
        return config_of(cls, value, "tool-use limit")


def argument_bytes(calls: Any) -> int:
    """The UTF-8 size of the JSON arguments of a turn's calls together (chat form, or any call objects)."""
    size = 0
    for call in calls:
        function = call.get("function", call) if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False, default=str)
        # Lone surrogates (an expert record's "\ud800" escape) are measured, not refused.
        size += len(arguments) if arguments.isascii() else len(arguments.encode("utf-8", "surrogatepass"))
    return size


def cut(body: bytes, limit: int) -> str:
    """An over-long UTF-8 body as its head and tail (`limit` bytes in all) around a marker naming the bytes cut."""
    head, tail = limit // 2, limit - limit // 2
    return join_cut(body[:head] + body[len(body) - tail :], len(body) - limit, limit)


def bounded_outputs(outputs: list[Any], limits: ToolUseLimits) -> list[str]:
    """Tool outputs as text, each within `output_bytes` and all within `observation_bytes` (plus one marker each).

    A result that is not a string (a user's backend may return one) is shown as JSON.
    """
    left = limits.observation_bytes
    kept = []
    for output in outputs:
        text = output if isinstance(output, str) else json.dumps(output, default=str)
        allowed = max(0, min(limits.output_bytes, left))
        # An ASCII text's length is its size (nearly every result: no 25 KB copy to measure it);
        # surrogatepass: a recorded output may hold a lone surrogate (a JSON "\ud800" escape).
        size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        kept.append(text if size <= allowed else cut(text.encode("utf-8", "surrogatepass"), allowed))
        left -= min(size, allowed)
    return kept
