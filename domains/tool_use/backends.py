"""Tool backends: what executes a sampled turn's tool calls in `ToolUseEnv.step`.

- `recorded`: the trajectory's own tool output (the pivot's `context["expert_tool_outputs"]`),
  returned for a sampled call equal to an expert call by the verifier's argument rules;
  otherwise an explicit "unavailable" result. It cannot tell execution equivalence.
- `tau-airline`: the tau-bench airline tools over the bundled database. The state at a pivot
  is rebuilt once (cached) by replaying the expert's earlier calls found in the pivot's
  messages; each sampled turn runs on its own copy-on-write layer over it.
- `http`: POST `{"name", "arguments", "pivot_id"}` to a tool server; the reply is JSON
  `{"output": ...}` (or any body, used as the output text). See `HttpBackend` for what counts
  as the server's failure (the sample is invalid) and what as a result.

`run(pivot, calls, deadline=...)`: a backend whose `run` takes a `deadline` keyword (a
`time.monotonic()` instant, the end of the step's tool time) is given one and must raise
InfrastructureError rather than run past it; the env also checks every backend's time after it
returns (see `limits.ToolUseLimits.step_timeout_s`).
"""

from __future__ import annotations

import http.client
import json
import re
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

from pivot_envs.config import ConfigError, at_least, between, option
from pivot_envs.domains.tool_use.airline import AirlineDatabase, State, bundled_database, call_tool
from pivot_envs.env import InfrastructureError
from pivot_envs.exchange import ExchangeDeadline, connection_to

if TYPE_CHECKING:
    from pivot_envs.pivot import Pivot

Call = tuple[str, Any]  # (tool name, parsed arguments)
# (expert call index, sampled name, sampled arguments) -> whether their executions are equal. An oracle may
# also have `expert_failed(index) -> bool`: where true, an equal execution is not enough to accept a call
# the argument rules reject (a refused call's failure, or a search's empty result, is shared by many wrong
# calls: `Effect.uninformative`); it still rejects a call they accept whose execution differs.
Equivalence = Callable[[int, str, Any], bool]

UNAVAILABLE = (
    "Error: tool output unavailable: the recorded backend has no recorded output for this call "
    "(it replays only the outputs of the expert's own calls)"
)


# A whole number written as a float ("amount 50.0"): the airline tools print the argument they got.
_WHOLE_FLOAT = re.compile(r"(?<![\d.])(\d+)\.0+(?!\.?\d)")
_JSON_STARTS = frozenset('{["-0123456789tfn')


def _normalized(text: str) -> Any:
    stripped = text.strip()
    if stripped[:1] in _JSON_STARTS:  # an error message or prose is not decoded (a raised ValueError costs)
        try:
            return json.loads(stripped)
        except ValueError:
            pass
    return _WHOLE_FLOAT.sub(r"\1", stripped)


@dataclass
class Effect:
    """What one call did, executed from the pivot's state: its output and the state change."""

    output: str
    changes: dict[str, dict[str, Any]]

    def same_as(self, other: Effect) -> bool:
        """Equal state changes (by value: 50 == 50.0) and equal outputs (JSON-normalized, or as text with
        whole numbers written alike)."""
        if self.changes != other.changes:
            return False
        return self.output == other.output or self.normalized_output == other.normalized_output

    @property
    def failed(self) -> bool:
        """The call was refused ("Error: ..." and no state change): many wrong calls fail alike, so an equal
        failure is no evidence that a call does what another does."""
        return not self.changes and self.output.startswith("Error:")

    @property
    def uninformative(self) -> bool:
        """The call was refused, or found nothing (`[]`, `{}`, `null`) and changed nothing: many wrong calls
        do that alike (a search for the reversed route finds no flight either), so an equal output is no
        evidence that a call does what another does. An empty output (`think`'s, "") is not one of them."""
        return self.failed or (not self.changes and self.normalized_output in ([], {}, None))

    @cached_property
    def normalized_output(self) -> Any:
        """The output as JSON, or as trimmed text with whole numbers written alike (computed once)."""
        return _normalized(self.output)


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
        # The last one-call turn run: (pivot id, name, the arguments object, its output, its layer).
        self._last_run: tuple[str, str, Any, str, State] | None = None

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

    def run(self, pivot: Pivot, calls: list[Call], deadline: float | None = None) -> list[str]:
        """Execute a turn's calls on a fresh layer over the pivot's state; stop at `deadline` (InfrastructureError)."""
        state = self.pivot_state(pivot).child()
        outputs = []
        for index, (name, arguments) in enumerate(calls):
            # Each call's work is bounded (limits module); the deadline is checked between calls.
            if deadline is not None and time.monotonic() > deadline:
                raise InfrastructureError(
                    f"pivot {pivot.id}: the step's tool deadline passed after {index} of {len(calls)} airline calls"
                )
            outputs.append(call_tool(state, name, arguments))
        # A one-call turn ran from the pivot's state: its effect is the one the verifier asks for next.
        self._last_run = (pivot.id, *calls[0], outputs[0], state) if len(calls) == 1 else None
        return outputs

    def effect(self, pivot: Pivot, name: str, arguments: Any) -> Effect:
        """Execute one call from the pivot's state on a throw-away layer (or reuse the last run's)."""
        last = self._last_run
        # The same arguments object (the run holds it, so its id is not reused): the same call.
        if last is not None and last[0] == pivot.id and last[1] == name and last[2] is arguments:
            return Effect(last[3], last[4].changes())
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
        return _AirlineEquivalence(self, pivot)


class _AirlineEquivalence:
    """The airline backend's oracle at one pivot (see `Equivalence`)."""

    def __init__(self, backend: AirlineBackend, pivot: Pivot) -> None:
        self.backend, self.pivot = backend, pivot

    def __call__(self, index: int, name: str, arguments: Any) -> bool:
        experts = self.backend.expert_effects(self.pivot)
        return index < len(experts) and self.backend.effect(self.pivot, name, arguments).same_as(
            experts[index]
        )

    def expert_failed(self, index: int) -> bool:
        experts = self.backend.expert_effects(self.pivot)
        return index < len(experts) and experts[index].uninformative


@dataclass
class HttpBackendConfig:
    """Options of the HTTP tool backend."""

    url: str = option(
        "", "the tool server's URL; each call is POSTed there as JSON {name, arguments, pivot_id}"
    )
    timeout_s: float = option(
        10.0,
        "seconds one attempt may take in all: connect, send, and the whole reply (a server trickling bytes is cut off)",
    )
    retries: int = option(
        2, "extra attempts after a connection error, a timeout, a reply cut short or a 5xx answer"
    )
    backoff_s: float = option(0.5, "wait before retry n is backoff_s * 2**(n-1) seconds")
    max_response_bytes: int = option(
        1 << 20, "reading a reply stops past this many bytes; what was read is the output, marked as cut"
    )

    def __post_init__(self) -> None:
        between(self, "timeout_s", 0, float("inf"), open_low=True, open_high=True)
        at_least(self, 0, "retries", "backoff_s")
        at_least(self, 1, "max_response_bytes")


class _Timeout(Exception):
    """An attempt passed its deadline."""


@dataclass
class _Reply:
    status: int
    body: bytes
    cut: bool  # the reply went on past max_response_bytes; body holds the first max_response_bytes


class HttpBackend:
    """Executes calls on a user's tool server over HTTP (the server owns the state).

    Each attempt has one wall-clock deadline, `timeout_s` (or what is left of the step's tool
    time, if less), for connecting, sending and reading the whole reply; a watchdog shuts the
    socket when it passes, so a server trickling bytes cannot hold a step. What the server's
    behaviour counts as:

    - unreachable, a timeout, a reply cut short, or 5xx, after the retries: the server failed,
      InfrastructureError (the sample is invalid, not scored 0); the step's deadline ends the
      retries at once;
    - 4xx: the tool's answer to the call ("Error: HTTP 404: ..."), a normal result; other
      non-2xx answers likewise (redirects are not followed);
    - a reply past `max_response_bytes`: reading stops there and the text read so far is the
      result with a marker (the server answered; its answer is too long to keep);
    - JSON nested too deeply to decode: the result "Error: ... nested too deeply ...", not a
      RecursionError; arguments nested too deeply to encode likewise, and nothing is sent.

    Connections go straight to the URL's host (no proxy), one per attempt.
    """

    name = "http"

    def __init__(self, config: HttpBackendConfig | None = None, **options: Any) -> None:
        self.config = config or HttpBackendConfig(**options)
        if not self.config.url:
            raise ConfigError(
                "the http tool backend needs a url: backend_config={'url': 'http://host:port/path'}"
            )
        parts = urllib.parse.urlsplit(self.config.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"the http tool backend's url must be http(s)://host[:port]/path, got {self.config.url!r}"
            )
        self._parts = parts

    def prepare(self, pivot: Pivot) -> None:
        return None

    def _exchange(self, body: bytes, deadline: float) -> _Reply:
        """One POST, all of it (connect, send, reply) before `deadline`; raises _Timeout past it."""
        parts, limit = self._parts, self.config.max_response_bytes
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Timeout
        connection = connection_to(parts, remaining)
        response = None
        watchdog = ExchangeDeadline(remaining)
        try:
            connection.connect()
            watchdog.hold(connection.sock)
            if watchdog.expired:  # the watchdog fired while connecting, before there was a socket to shut
                raise _Timeout
            path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
            connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            chunks, size = [], 0
            while size <= limit:
                chunk = response.read1(min(1 << 16, limit + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            short = not watchdog.expired and size <= limit and bool(response.length)
        except (OSError, http.client.HTTPException):
            if watchdog.expired:
                raise _Timeout from None
            raise
        finally:
            watchdog.cancel()
            if response is not None:
                response.close()
            connection.close()
        if watchdog.expired:
            raise _Timeout
        if short:
            raise http.client.IncompleteRead(b"".join(chunks), response.length)
        body_read = b"".join(chunks)
        return _Reply(response.status, body_read[:limit], size > limit)

    def _post(self, pivot: Pivot, name: str, arguments: Any, deadline: float | None) -> str:
        config, url = self.config, self.config.url
        try:
            body = json.dumps({"name": name, "arguments": arguments, "pivot_id": pivot.id}).encode()
        except RecursionError:
            return f"Error: the arguments of {name} are nested too deeply to send"
        problem, tried = "", 0
        for attempt in range(config.retries + 1):
            if attempt:
                pause = config.backoff_s * 2 ** (attempt - 1)
                if deadline is not None and time.monotonic() + pause >= deadline:
                    problem = f"{problem}; the step's tool deadline leaves no time to retry"
                    break
                time.sleep(pause)
            tried += 1
            attempt_deadline = time.monotonic() + config.timeout_s
            by_step = deadline is not None and deadline < attempt_deadline
            try:
                reply = self._exchange(body, deadline if by_step else attempt_deadline)
            except _Timeout:
                if by_step:
                    problem = (
                        "no complete reply before the step's tool deadline (ToolUseLimits.step_timeout_s)"
                    )
                    break
                problem = f"no complete reply within timeout_s={config.timeout_s} s"
                continue
            except (OSError, http.client.HTTPException) as error:
                problem = f"{type(error).__name__}: {error}"
                continue
            if reply.status >= 500:
                problem = f"HTTP {reply.status}: {reply.body[:200].decode('utf-8', 'replace')}"
                continue
            return _output_of(reply, config.max_response_bytes)
        raise InfrastructureError(
            f"pivot {pivot.id}: tool server {url} failed for {name!r} after {tried} attempt(s): {problem}"
        )

    def run(self, pivot: Pivot, calls: list[Call], deadline: float | None = None) -> list[str]:
        """POST each call in order; InfrastructureError when the server fails or `deadline` passes."""
        return [self._post(pivot, name, arguments, deadline) for name, arguments in calls]

    def equivalence(self, pivot: Pivot) -> Equivalence | None:
        return None


def _output_of(reply: _Reply, limit: int) -> str:
    """The tool output a (non-5xx) reply stands for."""
    text = reply.body.decode("utf-8", "replace")
    if reply.cut:
        return f"{text}\n[... the reply went on past max_response_bytes={limit}; reading stopped there ...]"
    if reply.status >= 300:
        # The server refused this call (unknown tool, bad arguments): the tool's answer.
        return f"Error: HTTP {reply.status}: {text[:500]}"
    try:
        body = json.loads(text)
        output = body.get("output", body) if isinstance(body, dict) else body
        return output if isinstance(output, str) else json.dumps(output)
    except ValueError:
        return text
    except RecursionError:
        return "Error: the tool server's reply is JSON nested too deeply to decode"


BACKENDS = ("recorded", "tau-airline", "http")
