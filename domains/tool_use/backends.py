"""Tool backends: what executes a sampled turn's tool calls in `ToolUseEnv.step`.

- `recorded`: the trajectory's own tool output (the pivot's `context["expert_tool_outputs"]`),
  returned for a sampled call equal to an expert call by the verifier's argument rules;
  otherwise an explicit "unavailable" result. It cannot tell execution equivalence.
- `tau-airline`: the tau-bench airline tools over the bundled database. The state at a pivot
  is rebuilt once (cached) by replaying the expert's earlier calls found in the pivot's
  messages; each sampled turn runs on its own copy-on-write layer over it.
- `http`: POST `{"name", "arguments", "pivot_id"}` to a tool server; the reply is JSON
  `{"output": ...}` (or any body, used as the output text). A server that cannot be reached
  or answers 5xx after the retries raises InfrastructureError (the sample is invalid, not 0).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pivot_envs.domains.tool_use.airline import AirlineDatabase, State, bundled_database, call_tool

from pivot_envs.config import option
from pivot_envs.env import InfrastructureError

if TYPE_CHECKING:
    from pivot_envs.pivot import Pivot

Call = tuple[str, Any]  # (tool name, parsed arguments)
# (expert call index, sampled name, sampled arguments) -> whether their executions are equal
Equivalence = Callable[[int, str, Any], bool]

UNAVAILABLE = (
    "Error: tool output unavailable: the recorded backend has no recorded output for this call "
    "(it replays only the outputs of the expert's own calls)"
)


def _normalized(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text.strip()


@dataclass
class Effect:
    """What one call did, executed from the pivot's state: its output and the state change."""

    output: str
    changes: dict[str, dict[str, Any]]

    def same_as(self, other: Effect) -> bool:
        """Equal outputs (JSON-normalized) and equal state changes."""
        if self.changes != other.changes:
            return False
        return self.output == other.output or _normalized(self.output) == _normalized(other.output)


class Backend(Protocol):
    """Executes tool calls at a pivot."""

    name: str

    def prepare(self, pivot: Pivot) -> None:
        """Restore (or fetch from the cache) the backend state at the pivot."""

    def run(self, pivot: Pivot, calls: list[Call]) -> list[str]:
        """Execute a sampled turn's calls in order, isolated from every other sample; their outputs."""

    def equivalence(self, pivot: Pivot) -> Equivalence | None:
        """The execution-equivalence oracle at this pivot, or None if the backend cannot tell."""


def expert_calls(message: dict[str, Any]) -> list[Call]:
    """The (name, parsed arguments) of an assistant message's tool calls."""
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        if not isinstance(function, dict):
            function = {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                pass
        calls.append((str(function.get("name", "")), {} if arguments is None else arguments))
    return calls


class RecordedBackend:
    """Replays the trajectory's recorded tool outputs for calls equal to the expert's."""

    name = "recorded"

    def __init__(self, match: Callable[[Pivot, str, Any], int | None]) -> None:
        # `match` returns the index of the expert call a sampled call equals (the verifier's rules).
        self.match = match

    def prepare(self, pivot: Pivot) -> None:
        return None

    def run(self, pivot: Pivot, calls: list[Call]) -> list[str]:
        recorded = pivot.context.get("expert_tool_outputs") or []
        outputs = []
        for name, arguments in calls:
            index = self.match(pivot, name, arguments)
            output = recorded[index] if index is not None and index < len(recorded) else None
            outputs.append(output if isinstance(output, str) else UNAVAILABLE)
        return outputs

    def equivalence(self, pivot: Pivot) -> Equivalence | None:
        return None


class AirlineBackend:
    """The tau-bench airline tools over a copy-on-write view of the airline database."""

    name = "tau-airline"

    def __init__(self, database: AirlineDatabase | None = None) -> None:
        self._database = database
        self._states: dict[str, tuple[list, State]] = {}
        self._expert_effects: dict[str, tuple[dict, list[Effect]]] = {}

    @property
    def database(self) -> AirlineDatabase:
        if self._database is None:
            self._database = bundled_database()
        return self._database

    def pivot_state(self, pivot: Pivot) -> State:
        """The state at the pivot: the expert's earlier calls replayed on the initial database (cached)."""
        cached = self._states.get(pivot.id)
        if cached is not None and cached[0] is pivot.messages:
            return cached[1]
        state = State(self.database)
        for message in pivot.messages:
            if message.get("role") == "assistant":
                for name, arguments in expert_calls(message):
                    call_tool(state, name, arguments)
        self._states[pivot.id] = (pivot.messages, state)
        return state

    def prepare(self, pivot: Pivot) -> None:
        self.pivot_state(pivot)

    def run(self, pivot: Pivot, calls: list[Call]) -> list[str]:
        return self.run_in(self.pivot_state(pivot).child(), calls)

    @staticmethod
    def run_in(state: State, calls: list[Call]) -> list[str]:
        """Execute calls in order on a given (sample) state; its writes stay in that state."""
        return [call_tool(state, name, arguments) for name, arguments in calls]

    def effect(self, pivot: Pivot, name: str, arguments: Any) -> Effect:
        """Execute one call from the pivot's state on a throw-away layer."""
        layer = self.pivot_state(pivot).child()
        output = call_tool(layer, name, arguments)
        return Effect(output, layer.changes())

    def expert_effects(self, pivot: Pivot) -> list[Effect]:
        """The effect of each expert call, each run from the pivot's state (cached)."""
        cached = self._expert_effects.get(pivot.id)
        if cached is not None and cached[0] is pivot.expert:
            return cached[1]
        effects = [self.effect(pivot, name, arguments) for name, arguments in expert_calls(pivot.expert)]
        self._expert_effects[pivot.id] = (pivot.expert, effects)
        return effects

    def equivalence(self, pivot: Pivot) -> Equivalence:
        def equivalent(index: int, name: str, arguments: Any) -> bool:
            experts = self.expert_effects(pivot)
            return index < len(experts) and self.effect(pivot, name, arguments).same_as(experts[index])

        return equivalent


@dataclass
class HttpBackendConfig:
    """Options of the HTTP tool backend."""

    url: str = option("", "the tool server's URL; each call is POSTed there as JSON {name, arguments, pivot_id}")
    timeout_s: float = option(10.0, "seconds to wait for the server (connect and read) per attempt")
    retries: int = option(2, "extra attempts after a connection error, a timeout or a 5xx answer")
    backoff_s: float = option(0.5, "wait before retry n is backoff_s * 2**(n-1) seconds")


class HttpBackend:
    """Executes calls on a user's tool server over HTTP (the server owns the state)."""

    name = "http"

    def __init__(self, config: HttpBackendConfig | None = None, **options: Any) -> None:
        self.config = config or HttpBackendConfig(**options)
        if not self.config.url:
            raise ValueError("the http tool backend needs a url: backend_config={'url': 'http://host:port/path'}")
        self._session = None

    def prepare(self, pivot: Pivot) -> None:
        return None

    def _post(self, payload: dict[str, Any]) -> str:
        import requests

        if self._session is None:
            self._session = requests.Session()
        url, config = self.config.url, self.config
        problem = ""
        for attempt in range(config.retries + 1):
            if attempt:
                time.sleep(config.backoff_s * 2 ** (attempt - 1))
            try:
                response = self._session.post(url, json=payload, timeout=(config.timeout_s, config.timeout_s))
            except requests.RequestException as error:
                problem = f"{type(error).__name__}: {error}"
                continue
            if response.status_code >= 500:
                problem = f"HTTP {response.status_code}: {response.text[:200]}"
                continue
            if response.status_code >= 400:
                # The server refused this call (unknown tool, bad arguments): the tool's answer.
                return f"Error: HTTP {response.status_code}: {response.text[:500]}"
            try:
                body = response.json()
            except ValueError:
                return response.text
            output = body.get("output", body) if isinstance(body, dict) else body
            return output if isinstance(output, str) else json.dumps(output)
        raise InfrastructureError(
            f"tool server {url} failed for {payload['name']!r} after {config.retries + 1} attempt(s): {problem}"
        )

    def run(self, pivot: Pivot, calls: list[Call]) -> list[str]:
        return [self._post({"name": name, "arguments": arguments, "pivot_id": pivot.id}) for name, arguments in calls]

    def equivalence(self, pivot: Pivot) -> Equivalence | None:
        return None


BACKENDS = ("recorded", "tau-airline", "http")
