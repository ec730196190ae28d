"""ToolUseEnv: conversational tool use at the pivots of expert trajectories (`pivot/tool-use-v0`)."""

from __future__ import annotations

import inspect
import time
from dataclasses import replace
from functools import cache
from importlib import resources
from typing import Any

from pivot_envs.chat import tool_name
from pivot_envs.domains.tool_use.backends import (
    BACKENDS,
    AirlineBackend,
    Backend,
    HttpBackend,
    RecordedBackend,
)
from pivot_envs.domains.tool_use.limits import ToolUseLimits, argument_bytes, bounded_outputs
from pivot_envs.domains.tool_use.parser import arguments_of, canonical_arguments, parse_action
from pivot_envs.domains.tool_use.verifier import CachedStrictVerifier, FunctionalVerifier
from pivot_envs.env import InfrastructureError, Outcome, ParsedAction, PivotEnv, PivotSource
from pivot_envs.errors import PivotSetError, UnknownNameError, did_you_mean
from pivot_envs.pivot import Pivot, iter_pivots

PIVOTS_RESOURCE = ("data", "airline_pivots.jsonl.gz")


@cache
def bundled_pivots() -> tuple[Pivot, ...]:
    """The bundled tau-bench airline pivots (read once per process; shared, treat as read-only)."""
    path = resources.files("pivot_envs.domains.tool_use").joinpath(*PIVOTS_RESOURCE)
    return tuple(iter_pivots(str(path)))


def short_bundled_pivots(count: int) -> list[Pivot]:
    """The first `count` bundled pivots of at most 8 messages whose expert calls tools, each with its long
    policy prompt cut to one line and only the expert's tools kept: prompts of a few hundred tokens."""
    chosen = []
    for pivot in bundled_pivots():
        if len(pivot.messages) <= 8 and pivot.expert.get("tool_calls"):
            names = {call["function"]["name"] for call in pivot.expert["tool_calls"]}
            messages = [dict(message) for message in pivot.messages]
            messages[0]["content"] = (
                "You are an airline customer service agent. Use the tools to help the user."
            )
            tools = [tool for tool in pivot.tools if tool_name(tool) in names]
            chosen.append(replace(pivot, messages=messages, tools=tools))
        if len(chosen) == count:
            break
    return chosen


@cache
def _takes_deadline(kind: type) -> bool:
    """Whether a backend class's `run` accepts the step's `deadline` keyword."""
    try:
        return "deadline" in inspect.signature(kind.run).parameters
    except (AttributeError, TypeError, ValueError):
        return False


class ToolUseEnv(PivotEnv):
    """A single-step env whose action is a whole assistant turn: tool call(s), a message, or both.

    gym.make("pivot/tool-use-v0", pivots=None, verifier="functional", verifier_config=None,
             backend=None, backend_config=None, limits=None)

    pivots:          a pivot file (or any trajectory format `pivot_envs.formats` reads), a list
                     of pivots; None for the bundled tau-bench airline sample.
    verifier:        "functional" (default; FunctionalVerifier, configured by verifier_config,
                     a dict of FunctionalConfig fields) or "strict" (exact match, paper Eq. 2).
    backend:         "recorded", "tau-airline", "http", or a Backend object; None picks each
                     pivot's `context["backend"]`, else "recorded".
    backend_config:  options of the http backend (HttpBackendConfig fields: url, timeout_s, ...).
    limits:          per-step bounds (ToolUseLimits or a dict of its fields: max_calls,
                     argument_bytes, output_bytes, observation_bytes, step_timeout_s); see the
                     limits module.

    step(action) returns the observation with the tool result messages (role "tool", carrying
    the call's tool_call_id) appended after the parsed action; info["output"] is the tool output
    (a list for several calls), cut to the limits. Unparseable actions score 0 with category
    "unparseable"; a turn with more calls than the limit scores 0 as "too_many_tool_calls", one
    with more argument bytes as "arguments_too_large", and neither runs anything (info["parsed"]
    is None for all three).
    """

    domain = "tool-use"
    default_verifier = "functional"
    verifiers = {"functional": FunctionalVerifier, "strict": CachedStrictVerifier}

    def __init__(
        self,
        pivots: PivotSource = None,
        verifier: str | Any | None = None,
        verifier_config: dict[str, Any] | None = None,
        backend: str | Backend | None = None,
        backend_config: dict[str, Any] | None = None,
        limits: ToolUseLimits | dict[str, Any] | None = None,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(pivots, verifier, verifier_config, render_mode)
        self.limits = ToolUseLimits.of(limits)
        self.strict_verifier = CachedStrictVerifier()
        # The recorded backend matches sampled calls to expert calls by the functional rules.
        self.functional = (
            self.verifier if isinstance(self.verifier, FunctionalVerifier) else FunctionalVerifier()
        )
        if isinstance(backend, str) and backend not in BACKENDS:
            raise UnknownNameError("tool backend", backend, BACKENDS)
        self.backend_choice = backend
        self.backend_config = dict(backend_config or {})
        self._backends: dict[str, Backend] = {}
        self._expert_argument_bytes: dict[str, tuple[dict[str, Any], int]] = {}
        self.backend: Backend | None = None

    def default_pivots(self) -> list[Pivot]:
        return list(bundled_pivots())

    def parse(self, action: Any) -> ParsedAction:
        parsed = parse_action(action)
        calls = (parsed.message or {}).get("tool_calls") or ()
        allowed = self.calls_allowed(self.pivot)
        # Refused before execution: the action's fault, scored 0 (valid), nothing runs.
        if len(calls) > allowed:
            detail = f"the turn makes {len(calls)} tool calls; at most {allowed} run in one turn (ToolUseLimits.max_calls)"
            return ParsedAction(None, "too_many_tool_calls", detail)
        size = argument_bytes(calls) if calls else 0
        if size > self.limits.argument_bytes:  # the expert turn's own size is allowed past the limit
            allowed = self.argument_bytes_allowed(self.pivot)
            if size > allowed:
                detail = f"the turn's call arguments hold {size} bytes of JSON; at most {allowed} (ToolUseLimits.argument_bytes)"
                return ParsedAction(None, "arguments_too_large", detail)
        return parsed

    def argument_bytes_allowed(self, pivot: Pivot | None) -> int:
        """The most bytes of call arguments one turn may hold at `pivot`: argument_bytes, or the expert turn's
        (as the parser writes it)."""
        if pivot is None or not pivot.expert.get("tool_calls"):
            return self.limits.argument_bytes
        cached = self._expert_argument_bytes.get(pivot.id)
        if cached is None or cached[0] is not pivot.expert:
            # Re-encoded as the parser encodes a sampled call's arguments (a record may be compact JSON).
            encoded = [{"arguments": canonical_arguments(call)} for call in pivot.expert["tool_calls"]]
            cached = self._expert_argument_bytes[pivot.id] = (pivot.expert, argument_bytes(encoded))
        return max(self.limits.argument_bytes, cached[1])

    def calls_allowed(self, pivot: Pivot | None) -> int:
        """The most tool calls one turn may make at `pivot`: max_calls, or the expert turn's count if higher."""
        expert_calls = pivot.expert.get("tool_calls") if pivot is not None else None
        return max(self.limits.max_calls, len(expert_calls) if isinstance(expert_calls, list) else 0)

    def backend_for(self, pivot: Pivot) -> Backend:
        """The backend that executes calls at this pivot (the env's choice, else the pivot's)."""
        choice = (
            self.backend_choice
            if self.backend_choice is not None
            else pivot.context.get("backend") or "recorded"
        )
        if not isinstance(choice, str):
            return choice
        backend = self._backends.get(choice)
        if backend is None:
            if choice == "recorded":
                backend = RecordedBackend(self.functional.expert_index_for)
            elif choice == "tau-airline":
                backend = AirlineBackend()
            elif choice == "http":
                backend = HttpBackend(**self.backend_config)
            else:
                raise PivotSetError(
                    f"pivot {pivot.id}: unknown tool backend {choice!r}{did_you_mean(choice, BACKENDS)}"
                )
            self._backends[choice] = backend
        return backend

    def restore(self, pivot: Pivot) -> None:
        self.backend = self.backend_for(pivot)
        self.backend.prepare(pivot)

    def execute(self, pivot: Pivot, action: dict[str, Any]) -> Outcome:
        raw_calls = action.get("tool_calls")
        if not raw_calls:
            return Outcome()  # a message turn executes nothing
        backend = self.backend if self.backend is not None else self.backend_for(pivot)
        ids, calls = [], []
        for call in raw_calls:
            ids.append(call["id"])
            calls.append((call["function"]["name"], arguments_of(call)[0]))
        seconds = self.limits.step_timeout_s
        deadline = time.monotonic() + seconds
        if _takes_deadline(type(backend)):
            outputs = backend.run(pivot, calls, deadline=deadline)
        else:
            outputs = backend.run(pivot, calls)
        if time.monotonic() > deadline:
            raise InfrastructureError(
                f"pivot {pivot.id}: the {backend.name} backend took longer than the step's tool deadline "
                f"of {seconds} s (ToolUseLimits.step_timeout_s)"
            )
        outputs = bounded_outputs(list(outputs)[: len(calls)], self.limits)
        messages = [
            {"role": "tool", "tool_call_id": call_id, "name": name, "content": output}
            for call_id, (name, _), output in zip(ids, calls, outputs)
        ]
        data: dict[str, Any] = {"backend": backend.name}
        equivalence = backend.equivalence(pivot)
        if equivalence is not None:
            data["equivalence"] = equivalence
        return Outcome(messages, outputs[0] if len(outputs) == 1 else outputs, data)
