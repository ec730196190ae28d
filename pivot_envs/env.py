"""PivotEnv: one pivot, one action, one verdict (a single-step gymnasium.Env)."""

from __future__ import annotations

import json
import logging
import os
import re
import reprlib
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.error import ResetNeeded
from gymnasium.vector import AutoresetMode

from pivot_envs.errors import PivotEnvsError, PivotSetError, UnknownNameError
from pivot_envs.observations import ObservationCopies
from pivot_envs.pivot import Pivot, domain_mismatch
from pivot_envs.spaces import Chat, Completion
from pivot_envs.verifiers import StrictVerifier, Verdict, Verifier

logger = logging.getLogger(__name__)


class InfrastructureError(PivotEnvsError, RuntimeError):
    """The environment (sandbox, tool backend), not the action, failed; the sample is invalid."""


@dataclass
class ParsedAction:
    """A parsed action: the assistant message in canonical form, or why parsing failed."""

    message: dict[str, Any] | None
    category: str = "ok"
    detail: str = ""


@dataclass
class Outcome:
    """What executing an action produced: messages appended to the observation (tool results),
    the output shown in `info["output"]`, and domain data for the verifier."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    output: Any = None
    data: dict[str, Any] = field(default_factory=dict)
    valid: bool = True
    detail: str = ""


PivotSource = str | os.PathLike | Iterable[Pivot] | Iterable[dict] | None


def pick_index(
    options: dict[str, Any] | None, by_id: dict[str, int], count: int, np_random: np.random.Generator
) -> int:
    """The pivot a reset goes to: `options["pivot"]` (an id), `options["index"]`, else a draw from
    `np_random` (the env's seeded generator). Raises KeyError / IndexError naming a bad choice."""
    options = options or {}
    if "pivot" in options:
        if options["pivot"] not in by_id:
            raise KeyError(f"unknown pivot id {options['pivot']!r} ({count} pivots in this env)")
        return by_id[options["pivot"]]
    if "index" in options:
        index = int(options["index"])
        if not 0 <= index < count:
            raise IndexError(f"pivot index {index} out of range [0, {count})")
        return index
    return int(np_random.integers(count))


class PivotEnv(gym.Env):
    """A single-step environment at the pivots of expert trajectories.

    reset(seed, options) picks a pivot: `options={"pivot": id}`, `options={"index": i}`, or a
    draw from `self.np_random` (so two envs reset with the same seed pick the same pivot); it
    restores the pivot's state (for sandboxed domains: the filesystem and shell after the
    expert's earlier commands) and returns the observation {"messages": s_t, "tools"} and
    info {"pivot_id", "index"}.

    step(action) takes raw completion text or an assistant message dict, parses it with the
    domain's parser, executes it (tool backend, sandbox), verifies it, and returns
    (observation after the action, reward, terminated=True, truncated=False, info) with
    info["category"] (the verdict's category), info["parsed"] (the assistant message, or None
    if unparseable), info["valid"] (False when the infrastructure failed: mask such samples
    out, never count them as reward 0), info["strict_reward"] (Eq. 2), info["output"] and
    info["detail"].

    step never raises on an action: a malformed one scores 0 with its category (valid); an
    exception of the domain's own code is a bug of the env, reported as category "env_error"
    (invalid, the exception named in info["detail"]). Observations and infos are fresh on every
    call (editing them changes nothing the env keeps; a caller that never edits them may set
    `env.unwrapped.copy_observations = False` to skip the two copies of the prefix, about 40 us
    an episode at the bundled 20 KB tool-use prefixes: see pivot_envs.observations) and infos
    are plain JSON data
    (`json.dumps(info)` works). Episodes are one step long, so vector envs should reset a
    sub-env in the step that ends it: metadata["autoreset_mode"] says so, and the registered
    envs make it gym.make_vec's default (see pivot_envs.registry).

    The current pivot is `self.pivot`; the whole set is `self.pivots`. Domains subclass this and
    override `default_pivots`, `parse`, `restore`, `execute` and the `verifiers` table.
    """

    metadata = {"render_modes": ["ansi"], "autoreset_mode": AutoresetMode.SAME_STEP}
    domain: str = "generic"
    default_verifier: str = "strict"
    # False: observations share the pivot's messages and tools (read-only for the caller).
    copy_observations: bool = True
    verifiers: dict[str, Callable[..., Verifier]] = {"strict": StrictVerifier}
    # For a domain whose canonical message drops the text a turn says beside its calls (terminal, SWE):
    # a staticmethod that reads that text from a raw action or message. The env then hands the verifier the
    # sampled action's text and the expert's (read before the domain makes the expert canonical) as
    # outcome.data["call_text"] and ["expert_call_text"], for its `call_text` rule.
    call_text_of: Callable[[Any], str] | None = None

    def __init__(
        self,
        pivots: PivotSource = None,
        verifier: str | Verifier | None = None,
        verifier_config: dict[str, Any] | None = None,
        render_mode: str | None = None,
    ) -> None:
        self.pivots: list[Pivot] = self._load_pivots(pivots)
        if not self.pivots:
            raise PivotSetError(f"{type(self).__name__}: the pivot set is empty")
        self._by_id = {pivot.id: i for i, pivot in enumerate(self.pivots)}
        self._expert_call_texts: dict[str, str] = (
            {}
            if self.call_text_of is None
            else {pivot.id: self.call_text_of(pivot.expert) for pivot in self.pivots}
        )
        self.verifier: Verifier = self._make_verifier(
            verifier or self.default_verifier, verifier_config or {}
        )
        self.strict_verifier = StrictVerifier()
        self.observation_space = Chat()
        self.action_space = Completion()
        self.render_mode = render_mode
        self.pivot: Pivot | None = None
        self._last: dict[str, Any] | None = None
        self._stepped = False

    # -- domain hooks -------------------------------------------------------------------------

    def default_pivots(self) -> list[Pivot]:
        """The domain's bundled pivots, used when no `pivots` are given."""
        raise PivotSetError(f"{type(self).__name__} has no bundled pivots: pass pivots=PATH")

    def parse(self, action: Any) -> ParsedAction:
        """Turn a raw completion or a message dict into a canonical assistant message."""
        if isinstance(action, dict):
            problem = message_problem(action)
            if problem:
                return ParsedAction(None, "unparseable", problem)
            return ParsedAction({"role": "assistant", **{k: v for k, v in action.items() if k != "role"}})
        if isinstance(action, str):
            return ParsedAction({"role": "assistant", "content": action})
        return ParsedAction(
            None, "unparseable", f"an action must be text or a message dict, got {type(action).__name__}"
        )

    def restore(self, pivot: Pivot) -> None:
        """Restore the state at `pivot` (nothing to do for pure chat domains)."""

    def execute(self, pivot: Pivot, action: dict[str, Any]) -> Outcome:
        """Execute a parsed action at the restored state; raise InfrastructureError on env failure."""
        return Outcome()

    # -- gymnasium API --------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        index = pick_index(options, self._by_id, len(self.pivots), self.np_random)
        self.pivot = self.pivots[index]
        self._stepped = False
        self._last = None
        self.restore(self.pivot)
        return self._fresh_observation(self.pivot), {"pivot_id": json_safe(self.pivot.id), "index": index}

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        if self.pivot is None or self._stepped:
            raise ResetNeeded("call reset() before step(): a pivot episode is one step long")
        pivot = self.pivot
        self._stepped = True
        parsed, outcome, verdict, strict = self._judge(pivot, action)
        if parsed.message is None:
            shown = {
                "role": "assistant",
                "content": json_safe(action) if isinstance(action, str) else action_text(action),
            }
        else:
            shown = json_safe(parsed.message)
        prefix = self._fresh_observation(pivot)
        observation = {
            "messages": [*prefix["messages"], shown, *json_safe(outcome.messages)],
            "tools": prefix["tools"],
        }
        # Each part is made JSON-safe once: info["parsed"] is the message the observation shows.
        info = {
            "pivot_id": json_safe(pivot.id),
            "category": json_safe(str(verdict.category)),
            "detail": json_safe(str(verdict.detail)),
            "parsed": None if parsed.message is None else shown,
            "valid": bool(verdict.valid and outcome.valid),
            "strict_reward": float(strict),
            "output": json_safe(outcome.output),
        }
        # What render() shows, kept as text: nothing a caller edits in what step returned.
        self._last = {
            "action": str(shown.get("content"))[:200],
            "reward": verdict.reward,
            "category": info["category"],
        }
        return observation, float(verdict.reward), True, False, info

    def _fresh_observation(self, pivot: Pivot) -> dict[str, Any]:
        """A new copy of `pivot`'s observation (see pivot_envs.observations), or with
        `copy_observations = False` one that shares the pivot's messages and tools."""
        if not self.copy_observations:
            return {"messages": list(pivot.messages), "tools": pivot.tools}
        copies = self.__dict__.get("_copies")
        if copies is None:
            copies = self._copies = ObservationCopies()
        return copies.copy(pivot)

    def _judge(self, pivot: Pivot, action: Any) -> tuple[ParsedAction, Outcome, Verdict, float]:
        """Parse, execute and verify `action` at `pivot`: (parsed action, outcome, verdict, strict reward).

        An exception of the domain's code is caught here: a bug of the env, not of the action, so
        the sample is invalid (category "env_error") rather than a crash of the whole batch. A
        RecursionError is the action's own nesting (thousands of levels): malformed, scored 0.
        """
        parsed: ParsedAction | None = None
        outcome: Outcome | None = None
        stage = "parse"
        try:
            parsed = self.parse(action)
            if parsed.message is None:
                return parsed, Outcome(), Verdict(0.0, parsed.category, parsed.detail), 0.0
            stage = "execute"
            try:
                outcome = self.execute(pivot, parsed.message)
            except InfrastructureError as error:
                outcome = Outcome(valid=False, detail=str(error))
            stage = "verify"
            if outcome.valid and self.call_text_of is not None:
                outcome.data.setdefault("call_text", self.call_text_of(action))
                outcome.data.setdefault("expert_call_text", self._expert_call_texts.get(pivot.id, ""))
            if outcome.valid:
                verdict = self.verifier.verify(pivot, parsed.message, outcome)
            else:
                verdict = Verdict(0.0, "infrastructure_error", outcome.detail, valid=False)
            strict = float(self.strict_verifier.verify(pivot, parsed.message).reward)
            if type(verdict.reward) is not float:  # an int or numpy reward of a domain's verifier
                verdict = replace(verdict, reward=float(verdict.reward))
            return parsed, outcome, verdict, strict
        except RecursionError:
            detail = f"the action is nested too deeply to {stage}"
            return (
                ParsedAction(None, "unparseable", detail),
                Outcome(),
                Verdict(0.0, "unparseable", detail),
                0.0,
            )
        except Exception as error:
            detail = f"pivot {pivot.id}: {type(self).__name__}.{stage} raised {type(error).__name__}: {_text_of(error)}"
            logger.warning("%s (an env bug; the sample is marked invalid)", detail, exc_info=error)
            if parsed is None:
                parsed = ParsedAction(None, "env_error")
            return (
                parsed,
                outcome if outcome is not None else Outcome(),
                Verdict(0.0, "env_error", detail, valid=False),
                0.0,
            )

    def render(self) -> str | None:
        if self.render_mode != "ansi" or self.pivot is None:
            return None
        lines = [f"pivot {self.pivot.id} ({self.domain})"]
        lines += [f"[{m.get('role')}] {str(m.get('content'))[:200]}" for m in self.pivot.messages[-3:]]
        if self._last:
            lines.append(f"action: {self._last['action']}")
            lines.append(f"reward {self._last['reward']} ({self._last['category']})")
        return "\n".join(lines)

    # -- helpers ----------------------------------------------------------------------------------

    def _load_pivots(self, pivots: PivotSource) -> list[Pivot]:
        if pivots is None:
            return list(self.default_pivots())
        if isinstance(pivots, (str, os.PathLike)):
            return load_pivot_file(pivots, domain=self.domain)
        loaded = [p if isinstance(p, Pivot) else Pivot.from_dict(p) for p in pivots]
        mismatch = domain_mismatch(loaded, self.domain)
        if mismatch:
            warnings.warn(f"{type(self).__name__}: {mismatch}", stacklevel=3)
        return loaded

    def _make_verifier(self, verifier: str | Verifier, config: dict[str, Any]) -> Verifier:
        if not isinstance(verifier, str):
            return verifier
        if verifier not in self.verifiers:
            raise UnknownNameError(f"{type(self).__name__} verifier", verifier, self.verifiers)
        factory = self.verifiers[verifier]
        return factory(**config) if config else factory()


def message_problem(message: dict[str, Any]) -> str:
    """What keeps a message dict from being a chat-form assistant turn ("" when nothing does):
    content that is not text, content parts or None; tool calls that are not a list of
    {"function": {"name": text, "arguments": JSON text or a JSON object}}."""
    content = message.get("content")
    parts_ok = isinstance(content, list) and all(
        isinstance(p, dict) and isinstance(p.get("text", ""), str) for p in content
    )
    if not (content is None or isinstance(content, str) or parts_ok):
        return f"a message's content must be text, content parts or None, got {type(content).__name__}"
    calls = message.get("tool_calls")
    if calls is None:
        return ""
    if not isinstance(calls, list):
        return f"a message's tool_calls must be a list, got {type(calls).__name__}"
    for index, call in enumerate(calls):
        function = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            return f"tool call {index} is not {{'function': {{'name': text, 'arguments': ...}}}}"
        arguments = function.get("arguments")
        if not (arguments is None or isinstance(arguments, str) or _is_json_object(arguments)):
            return f"tool call {index} ({function['name']}): arguments must be JSON text or a JSON object"
    return ""


def _is_json_object(value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


_SURROGATE = re.compile("[\ud800-\udfff]")
_MAX_DEPTH = 64  # deeper values are shown as bounded text: an action may nest 10,000 levels
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 6, 4000, 4000
_SHORT.maxdict = _SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxset = _SHORT.maxfrozenset = 100


def _text_of(value: Any) -> str:
    """str(value) (its first 4,000 characters), or its type's name where str itself fails."""
    try:
        return json_safe(str(value)[:4000])
    except Exception:
        return f"<unprintable {type(value).__name__}>"


def action_text(action: Any) -> str:
    """Bounded text of an action that is not text (shown in the observation when it is unparseable)."""
    try:
        return json_safe(_SHORT.repr(action))
    except Exception:
        return f"<unprintable {type(action).__name__}>"


def json_safe(value: Any, depth: int = 0) -> Any:
    """`value` as plain JSON data, a new structure: dicts with string keys, lists, strings without
    lone surrogates (replaced by U+FFFD), numbers, booleans and None; numpy values by their
    Python value, bytes decoded as UTF-8, anything else (and anything nested deeper than 64
    levels) by a bounded repr. `json.dumps` always accepts the result.
    """
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if depth == 0 and type(value) in _CONTAINERS:
        # Most values are plain JSON already: copying their dicts and lists (strings and numbers are
        # immutable, so shared) is 5-20x faster than a JSON round trip; the walk below does the rest.
        try:
            return _plain_copy(value, 0)
        except _NotPlain:
            pass
    if isinstance(value, str):
        return value if value.isascii() or _encodes(value) else _SURROGATE.sub("\ufffd", value)
    if depth >= _MAX_DEPTH:
        return action_text(value)
    if isinstance(value, dict):
        return {_json_key(key): json_safe(item, depth + 1) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(item, depth + 1) for item in value]
    if isinstance(value, (bytes, bytearray)):
        return json_safe(bytes(value).decode("utf-8", "replace"))
    if isinstance(value, (np.generic, np.ndarray)):
        return json_safe(value.tolist(), depth + 1)
    return action_text(value)


class _NotPlain(Exception):
    """A value holds something other than plain JSON (json_safe then walks it)."""


_CONTAINERS = frozenset({dict, list})
_PLAIN_SCALARS = frozenset({int, float, bool, type(None)})


def _plain_copy(value: dict | list, depth: int) -> dict | list:
    """A new copy of the dicts and lists of plain JSON data (exact types, string keys, UTF-8
    encodable strings, at most 64 levels), sharing its immutable leaves; raises _NotPlain otherwise.
    The leaf checks are written out here: a helper call per item doubles the cost."""
    if depth >= _MAX_DEPTH:
        raise _NotPlain
    is_dict = type(value) is dict
    copied: Any = {} if is_dict else [None] * len(value)
    for key, item in value.items() if is_dict else enumerate(value):
        if is_dict and (type(key) is not str or not (key.isascii() or _encodes(key))):
            raise _NotPlain
        kind = type(item)
        if kind is str:
            if not (item.isascii() or _encodes(item)):
                raise _NotPlain
        elif kind in _CONTAINERS:
            item = _plain_copy(item, depth + 1)
        elif kind not in _PLAIN_SCALARS:
            raise _NotPlain
        copied[key] = item
    return copied


def _encodes(text: str) -> bool:
    """Whether `text` encodes as UTF-8 (no lone surrogate); 20x faster than searching it with a regex."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_key(key: Any) -> str | int | float | bool | None:
    if key is None or isinstance(key, (bool, int, float)):
        return key
    return json_safe(key) if isinstance(key, str) else action_text(key)


def load_pivot_file(path: str | os.PathLike, domain: str = "") -> list[Pivot]:
    """Pivots from a file: our pivot JSONL, or any trajectory format `pivot_envs.formats` reads."""
    from pivot_envs.formats import read_as_pivots

    return read_as_pivots(path, domain=domain)
